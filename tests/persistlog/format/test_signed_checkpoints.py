"""Signed checkpoints: ``signing_key=`` signs the chain head in every seal and checkpoint,
and ``persistlog verify --public-key`` proves the history up to the newest signed head.

The hostile cases (after LevelDB's corruption tests) are made by the attacker of
``tamper``: one who can write the bucket, knows the format and holds no key. Each fixes
every CRC and LSN and recomputes every hash, link, seal head and checkpoint head, so
only a signature can tell; verify names the place each time. The fuzz lane mutates signed
logs at random and finds no forgery that verify accepts.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
import tamper
from hypothesis import event, given
from hypothesis import strategies as st
from childproc import run_json
from hypothesis_profiles import active_profile
from kv_app import App

import persistlog
from destinations import open_destination
from persistlog._inspect.audit import audit
from persistlog._inspect.destination_check import inspect_destination
from persistlog._format import constants as F
from persistlog._format.signing import Signer, Verifier
from persistlog._write.log import parts_of
from persistlog.cli import main

ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

KEY = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC_PEM = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = main(list(argv))
    return status, out.getvalue()


@pytest.fixture
def public_key(tmp_path: Any) -> str:
    path = str(tmp_path / "writer.pub")
    with open(path, "wb") as f:
        f.write(PUBLIC_PEM)
    return path


def write_signed(url: str, *, logs: int = 3, updates: int = 6) -> App:
    """``logs`` sealed logs; a checkpoint after every batch (``sign_interval`` tiny)."""
    app = App({"seed": 0})
    app.open(url, durability="fsync", segment_bytes=4096, retain=10, signing_key=KEY, sign_interval=1e-9)
    for r in range(logs):
        for i in range(updates):
            app.put(f"k{r}.{i}", "v" * 700)
        if r < logs - 1:
            app.log.rotate()  # type: ignore[union-attr]
    app.log.close()  # type: ignore[union-attr]
    return app


def verify(url: str, public_key: str) -> tuple[int, str, dict[str, Any]]:
    status, out = cli("verify", url, "--public-key", public_key)
    _, js = cli("verify", url, "--public-key", public_key, "--json")
    return status, out, json.loads(js)


def checkpoints(segments: list[tamper.Segment]) -> list[tuple[tamper.Segment, int]]:
    return [(s, i) for s in segments for i, b in enumerate(s.batches) if b.control_type() == "checkpoint"]


def test_a_signed_destination_is_proven_up_to_its_newest_seal(log_dir: str, public_key: str) -> None:
    write_signed(log_dir)
    status, out, js = verify(log_dir, public_key)
    assert status == 0 and "PROVEN" in out, out
    proven = js["signed"]["proven"]
    assert js["ok"] and proven["log"] == 3 and proven["kind"] == "seal" and proven["chain_from"] == 1
    segments = tamper.load(log_dir)
    assert len(checkpoints(segments)) >= 18
    seal = segments[-1].batches[-1].controls()[0]
    assert seal["key"] == Signer(KEY).key_id and len(seal["sig"]) == 64 and proven["head"] == seal["chain"].hex()


def test_a_writer_that_changed_its_key_is_proven_with_both_public_keys(log_dir: str, tmp_path: Any) -> None:
    """Logs signed with an old key, then (reopened with a new ``signing_key``) with a new
    one: proven with both public keys given, and with the new one alone the old key's
    signatures are named as not verifying."""
    new_key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    write_signed(log_dir, logs=2)
    app = App({"seed": 0})
    app.open(log_dir, durability="fsync", segment_bytes=4096, retain=10, signing_key=new_key, sign_interval=1e-9)
    app.put("after", "v" * 700)
    app.log.close()  # type: ignore[union-attr]
    paths = []
    for name, key in (("old.pub", KEY), ("new.pub", new_key)):
        paths.append(str(tmp_path / name))
        with open(paths[-1], "wb") as f:
            f.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    status, out = cli("verify", log_dir, "--public-key", paths[0], "--public-key", paths[1])
    assert status == 0 and "PROVEN" in out and Signer(KEY).key_id in out and Signer(new_key).key_id in out, out
    _, js = cli("verify", log_dir, "--public-key", paths[0], "--public-key", paths[1], "--json")
    signed = json.loads(js)["signed"]
    assert signed["ok"] and signed["key_ids"] == [Signer(KEY).key_id, Signer(new_key).key_id]
    assert signed["proven"]["log"] == 3 and signed["proven"]["chain_from"] == 1
    # With the new key alone the old key's signatures are not checked, and not damage: the
    # chain from log 1 up to the newest head (signed with the new key) is still proven.
    status, out = cli("verify", log_dir, "--public-key", paths[1])
    assert status == 0 and "PROVEN" in out and "BROKEN" not in out, out
    assert f"key(s) {Signer(KEY).key_id}, not given: not checked" in out
    _, js = cli("verify", log_dir, "--public-key", paths[1], "--json")
    unknown = json.loads(js)["signed"]["unknown_keys"]
    assert list(unknown) == [Signer(KEY).key_id] and unknown[Signer(KEY).key_id] >= 2
    # With the old key alone, what the new key signed is not checked: proven up to log 2.
    _, js = cli("verify", log_dir, "--public-key", paths[0], "--json")
    signed = json.loads(js)["signed"]
    assert signed["ok"] and signed["proven"]["log"] == 2 and list(signed["unknown_keys"]) == [Signer(new_key).key_id]


def test_a_secondarys_seals_are_signed_as_the_writers_are(log_dir: str, public_key: str, tmp_path: Any) -> None:
    backup = str(tmp_path / "backup")
    app = App({"seed": 0})
    app.open(log_dir, durability="fsync", segment_bytes=4096, retain=10, signing_key=KEY, sign_interval=3600,
             secondaries=[backup])
    for r in range(3):
        app.put(f"k{r}", "v" * 700)
        app.log.rotate()  # type: ignore[union-attr]
    app.log.close()  # type: ignore[union-attr]
    for url in (log_dir, backup):
        status, out, js = verify(url, public_key)
        assert status == 0 and "PROVEN" in out, (url, out)
        proven = js["signed"]["proven"]
        assert proven["kind"] == "seal" and proven["log"] == 4, (url, proven)
    seals = [b.controls()[0] for s in tamper.load(backup) for b in s.batches if b.control_type() == "seal"]
    assert len(seals) == 4 and all(seal["key"] == Signer(KEY).key_id for seal in seals)


def test_without_a_signature_nothing_is_proven(log_dir: str, public_key: str) -> None:
    App({"a": 1}).open(log_dir).close()
    status, out, js = verify(log_dir, public_key)
    assert status == 1 and "UNPROVEN" in out and js["signed"]["proven"] is None


def test_another_key_proves_nothing(log_dir: str, tmp_path: Any) -> None:
    write_signed(log_dir, logs=1)
    other = str(tmp_path / "other.pub")
    with open(other, "wb") as f:
        f.write(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    status, out, _ = verify(log_dir, other)
    assert status == 1 and "UNPROVEN" in out and f"key(s) {Signer(KEY).key_id}, not given: not checked" in out


def edit_record(segment: tamper.Segment, index: int) -> None:
    b = segment.batches[index]
    at = b.body.index(b"vvvv")
    b.body = b.body[:at] + b"w" + b.body[at + 1:]


def first_checkpoint_after(segments: list[tamper.Segment], segment: tamper.Segment, index: int) -> tuple[str, int]:
    after = [(s, i) for s, i in checkpoints(segments)
             if (segments.index(s), i) > (segments.index(segment), index)]
    s, i = after[0]
    return s.name, tamper.offset_of(s, i)


def test_edit_one_byte_and_fix_its_crc(log_dir: str, public_key: str) -> None:
    write_signed(log_dir)
    segments = tamper.load(log_dir)
    seg, index, _ = tamper.record_batches(segments)[5]
    edit_record(seg, index)
    tamper.save(log_dir, segments, relink_all=True)
    name, offset = first_checkpoint_after(segments, seg, index)
    assert cli("verify", log_dir)[0] == 0  # without the key the rewrite reads as sound
    status, out, js = verify(log_dir, public_key)
    assert status == 1 and not js["ok"]
    assert f"CORRUPT: log {seg.seq} segment {name} offset {offset}: signed checkpoint: the signature does not verify" in out
    assert "BROKEN" in out


def test_edit_one_byte_without_rehashing_is_a_chain_break_before_the_signed_head(log_dir: str, public_key: str) -> None:
    write_signed(log_dir)
    segments = tamper.load(log_dir)
    seg, index, _ = tamper.record_batches(segments)[5]
    edit_record(seg, index)
    tamper.save(log_dir, segments)
    status, out, js = verify(log_dir, public_key)
    assert status == 1 and "BROKEN" in out and "hash chain broken" in out
    assert js["signed"]["breaks"][0]["offset"] == tamper.offset_of(seg, index + 1)


def test_drop_a_batch(log_dir: str, public_key: str) -> None:
    write_signed(log_dir)
    segments = tamper.load(log_dir)
    seg, index, _ = tamper.record_batches(segments)[9]
    del seg.batches[index:index + 2]  # the batch and the checkpoint after it
    tamper.renumber(segments)
    tamper.save(log_dir, segments, relink_all=True)
    status, out, _ = verify(log_dir, public_key)
    s, i = next((s, i) for s, i in checkpoints(segments) if (segments.index(s), i) >= (segments.index(seg), index))
    assert status == 1 and f"CORRUPT: log {s.seq} segment {s.name} offset {tamper.offset_of(s, i)}: signed checkpoint" in out


def test_swap_two_segments(log_dir: str, public_key: str) -> None:
    write_signed(log_dir, logs=1, updates=20)
    segments = tamper.load(log_dir)
    assert len(segments) >= 4
    a, b = segments[1], segments[2]
    a.batches, b.batches = b.batches, a.batches
    tamper.renumber(segments)
    tamper.save(log_dir, segments, relink_all=True)
    status, out, js = verify(log_dir, public_key)
    assert status == 1 and not js["ok"]
    first = js["signed"]["problems"][0]
    index = next(i for i, batch in enumerate(a.batches) if batch.control_type() == "checkpoint")
    assert (first["segment"], first["offset"]) == (a.name, tamper.offset_of(a, index))


def test_truncate_after_a_signed_head(log_dir: str, public_key: str) -> None:
    """Log 2 cut right after one of its checkpoints: its later records and its seal are
    gone, and log 3 still links to where it really ended. (The oldest log cut so reads
    as a retention interrupted while it deleted that log: the proof starts after it.)"""
    write_signed(log_dir)
    segments = tamper.load(log_dir)
    log2 = [s for s in segments if s.seq == 2]
    seg, index = [(s, i) for s, i in checkpoints(log2)][2]
    cut = tamper.offset_of(seg, index + 1)
    later = [s for s in log2 if s.number > seg.number]
    for s in later:
        os.remove(os.path.join(log_dir, s.name))
    os.truncate(os.path.join(log_dir, seg.name), cut)
    status, out, js = verify(log_dir, public_key)
    assert status == 1 and "BROKEN" in out
    breaks = js["signed"]["breaks"]
    assert (breaks[0]["log"], breaks[0]["segment"], breaks[0]["offset"]) == (2, seg.name, cut)
    assert "missing from its end" in breaks[0]["reason"]


def test_replay_an_older_log_in_place_of_a_newer_one(log_dir: str, public_key: str) -> None:
    write_signed(log_dir)
    segments = tamper.replace_log(tamper.load(log_dir), 2, 1)
    tamper.renumber(segments)
    tamper.save(log_dir, segments, relink_all=True)
    status, out, js = verify(log_dir, public_key)
    assert status == 1
    first = js["signed"]["problems"][0]
    assert first["log"] == 2 and first["segment"] == F.segment_name(2, 0) and "does not verify" in first["reason"]


WITHOUT_CRYPTOGRAPHY = """
    import json, sys
    import persistlog
    from persistlog.cli import main

    out = {}
    try:
        persistlog.open(sys.argv[1], lambda emit: None, signing_key=sys.argv[3])
    except Exception as e:
        out["open"] = [type(e).__name__, str(e), getattr(e, "extra", None), isinstance(e, ImportError)]
    out["verify"] = main(["verify", sys.argv[2], "--public-key", sys.argv[3]])
    got = []
    persistlog.restore(sys.argv[2], got.append)  # reading a signed log needs neither
    out["restored"] = len(got)
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_without_the_cryptography_package_signing_and_proving_say_what_to_install(
    log_dir: str, public_key: str, tmp_path: Any
) -> None:
    write_signed(log_dir, logs=1, updates=2)
    out = run_json(WITHOUT_CRYPTOGRAPHY, str(tmp_path / "new"), log_dir, public_key, hide=["cryptography"])
    name, message, extra, import_error = out["open"]
    assert name == "MissingDependencyError" and extra == "audit" and import_error
    assert "pip install 'persistlog[audit]'" in message
    assert out["verify"] == 2  # cannot check: neither clean nor damaged
    assert out["restored"] == 3
    assert not (tmp_path / "new").exists()


def test_the_signing_key_shows_nowhere(log_dir: str, tmp_path: Any) -> None:
    private = KEY.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    pem = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    secrets = [private.hex(), pem.decode().splitlines()[1], repr(private)]
    lg = persistlog.open(log_dir, lambda emit: None, signing_key=pem, sign_interval=1e-9)
    lg.update({"k": 1})
    checkpoints = parts_of(lg).writer._checkpoints
    shown = [repr(lg), repr(checkpoints), repr(checkpoints.signer), str(lg.stats())]
    lg.close()
    shown += [cli("info", log_dir, "--json")[1], cli("dump", log_dir, "--control", "--json")[1]]
    with pytest.raises(ValueError) as bad:
        persistlog.open(str(tmp_path / "other"), lambda emit: None, signing_key=pem[:-40] + b"\n")
    shown.append(str(bad.value))
    for text in shown:
        for secret in secrets:
            assert secret not in text
    assert Signer(KEY).key_id in shown[2]


# -- fuzz: no accepted forgery ------------------------------------------------------------

MUTATIONS = ("flip", "drop", "duplicate", "swap", "cut", "control")


@pytest.fixture(scope="module")
def signed_original(tmp_path_factory: Any) -> tuple[str, list[tuple[int, Any]]]:
    url = str(tmp_path_factory.mktemp("signed") / "log")
    write_signed(url, logs=2, updates=5)
    return url, [(r.lsn, r.record) for r in persistlog.read(url)]


def mutate(segments: list[tamper.Segment], data: Any) -> None:
    everything = [(s, i) for s in segments for i in range(len(s.batches))]
    if not everything:
        return
    kind = data.draw(st.sampled_from(MUTATIONS))
    s, i = data.draw(st.sampled_from(everything))
    b = s.batches[i]
    if kind == "flip" and b.body:
        at = data.draw(st.integers(0, len(b.body) - 1))
        b.body = b.body[:at] + bytes([b.body[at] ^ data.draw(st.integers(1, 255))]) + b.body[at + 1:]
    elif kind == "drop":
        del s.batches[i]
    elif kind == "duplicate":
        s.batches.insert(i, tamper.Batch(**vars(b)))
    elif kind == "swap":
        t, j = data.draw(st.sampled_from(everything))
        s.batches[i], t.batches[j] = t.batches[j], s.batches[i]
    elif kind == "cut":
        del s.batches[i:]
        s.trailer = False
        for later in [x for x in segments if x.seq == s.seq and x.number > s.number]:
            segments.remove(later)
    elif kind == "control" and b.control_type() not in (None, "?"):
        controls = b.controls()
        key = data.draw(st.sampled_from(list(controls[0])))
        value = controls[0][key]
        if isinstance(value, int) and not isinstance(value, bool):
            controls[0][key] = value + data.draw(st.integers(1, 3))
        elif isinstance(value, bytes) and value:
            controls[0][key] = bytes([value[0] ^ 1]) + value[1:]
        b.set_controls(controls)


@pytest.mark.slow
@active_profile(max_examples=40)
@given(data=st.data(), renumber=st.booleans(), rehash=st.booleans(), rounds=st.integers(1, 3))
def test_no_forgery_of_a_signed_log_is_accepted(
    signed_original: tuple[str, list[tuple[int, Any]]], tmp_path_factory: Any, data: Any, renumber: bool,
    rehash: bool, rounds: int,
) -> None:
    original, records = signed_original
    url = str(tmp_path_factory.mktemp("forged") / "log")
    shutil.copytree(original, url)
    segments = tamper.load(url)
    for _ in range(rounds):
        mutate(segments, data)
    segments = [s for s in segments if s.batches]
    if renumber and segments:
        tamper.renumber(segments)
    tamper.save(url, segments, relink_all=rehash)
    dest = open_destination(url)
    try:
        report = inspect_destination(dest)
        verdict = audit(report, Verifier(PUBLIC_PEM))
    finally:
        dest.close()
    event("rejected" if not verdict.ok else "accepted")
    if not verdict.ok:
        return
    # Accepted: every record the proof covers (from the log its chain starts in up to the
    # newest signed head) must be exactly what was written.
    assert verdict.proven is not None and verdict.chain_from is not None
    start = report.log_info(verdict.chain_from).first_lsn  # type: ignore[union-attr]
    stop = verdict.proven.lsn
    if start >= stop:
        return
    got = []
    try:
        for r in persistlog.read(url, start=start, stop=stop):
            got.append((r.lsn, r.record))
    except persistlog.CorruptLogError as e:  # damage past the head (its trailer, say) is no forgery
        assert e.log is not None and e.segment is not None and e.offset is not None
        parsed = F.parse_segment_name(e.segment)
        assert parsed is not None and (e.log, parsed[1], e.offset) >= verdict.proven.position, e
    assert got == [(lsn, r) for lsn, r in records if start <= lsn < stop]
