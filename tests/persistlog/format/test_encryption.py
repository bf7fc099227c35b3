"""Encryption at rest (docs/FORMAT.md, "Encrypted batches"): record batches sealed with
AES-256-GCM under a key the app's provider gives by key id; every reader takes the same
provider; a missing or wrong key is KeyUnavailableError, never CorruptLogError; tampered
ciphertext (CRCs and chain recomputed) is damage; keys never show."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
import zlib
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import crypt_keys
import pytest
import tamper
from crypt_keys import KEYS, provider
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_app import App, restore_state
from log_files import crash, truncate

import persistlog
from persistlog._format import decoder, encoder
from persistlog._format import constants as F
from persistlog._format.crypt import Keyring
from persistlog.cli import main

PROVIDER = "crypt_keys:provider"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def write(url: str, *, rotations: int = 1, updates: int = 6, key_id: Any = "2026-10", **options: Any) -> App:
    app = App({"seed": 0})
    options.setdefault("durability", "fsync")
    app.open(url, segment_bytes=4096, retain=10, key_provider=provider, key_id=key_id, **options)
    for r in range(rotations + 1):
        for i in range(updates):
            app.put(f"k{r}.{i}", "secret-" + "v" * 700)
        if r < rotations:
            app.log.rotate()  # type: ignore[union-attr]
    app.log.close()  # type: ignore[union-attr]
    return app


def stored_bytes(url: str) -> bytes:
    return b"".join(open(os.path.join(url, n), "rb").read() for n in sorted(os.listdir(url)) if n.endswith(".plog"))


@pytest.mark.parametrize("durability", ["buffered", "flush", "fsync"])
def test_round_trip_in_every_durability_mode(log_dir: str, durability: str) -> None:
    app = write(log_dir, durability=durability)
    assert b"secret-" not in stored_bytes(log_dir)  # no record in clear
    segments = tamper.load(log_dir)
    records = tamper.record_batches(segments)
    assert records and all(b.flags & F.FLAG_ENCRYPTED for _, _, b in records)
    assert not any(b.flags & F.FLAG_ENCRYPTED for s in segments for b in s.batches if b.kind == F.KIND_CONTROL)
    state, result = restore_state(log_dir, key_provider=provider)
    assert state == app.data and result.complete


def test_round_trip_across_rotation_and_reopen_with_a_key_rotated_at_rotation(log_dir: str) -> None:
    key = {"id": "2026-10"}
    app = App({"a": 1})
    app.open(log_dir, durability="fsync", retain=10, key_provider=provider, key_id=lambda: key["id"])
    app.put("b", 2)
    key["id"] = "2026-11"  # the app moves to a new key at its rotation
    app.log.rotate()  # type: ignore[union-attr]
    app.put("c", 3)
    app.log.close()  # type: ignore[union-attr]
    state, _ = restore_state(log_dir, key_provider=provider)
    app2 = App(state)
    app2.open(log_dir, durability="fsync", retain=10, key_provider=provider, key_id="2026-11")
    app2.put("d", 4)
    app2.log.close()  # type: ignore[union-attr]
    ids = {b.body[1:1 + b.body[0]].decode() for s in tamper.load(log_dir) for b in s.batches
           if b.flags & F.FLAG_ENCRYPTED}
    assert ids == {"2026-10", "2026-11"}
    # info names the key ids of each log (read without a provider), never a key.
    status, out, _ = cli("info", log_dir, "--json")
    assert status == 0 and [lg["key_ids"] for lg in json.loads(out)["logs"]] == [["2026-10"], ["2026-11"], ["2026-11"]]
    status, out, _ = cli("info", log_dir)
    assert status == 0 and "encrypted    keys 2026-10, 2026-11" in out
    assert not any(k.hex() in out for k in KEYS.values())
    # Old logs stay readable: every record of every log, read from the first.
    updates = [r.record["key"] for r in persistlog.read(log_dir, key_provider=provider) if r.kind == "update"]
    assert updates == ["b", "c", "d"]
    assert restore_state(log_dir, key_provider=provider)[0] == {"a": 1, "b": 2, "c": 3, "d": 4}
    # A provider that lost the old key still reads the newest complete log...
    newest_only = {"2026-11": KEYS["2026-11"]}
    assert restore_state(log_dir, key_provider=newest_only.get)[0]["d"] == 4
    # ...and names the old key id when asked for the history.
    with pytest.raises(persistlog.KeyUnavailableError) as info:
        list(persistlog.read(log_dir, key_provider=newest_only.get))
    assert info.value.key_id == "2026-10"


def test_a_follower_reads_an_encrypted_log(log_dir: str) -> None:
    app = App({"a": 1})
    app.open(log_dir, durability="fsync", key_provider=provider, key_id="2026-10")
    seen: list[Any] = []
    follower = persistlog.follow(log_dir, seen.append, key_provider=provider)
    app.put("b", 2)
    app.log.sync()  # type: ignore[union-attr]
    follower.poll()
    app.put("c", 3)
    app.log.close()  # type: ignore[union-attr]
    follower.poll()
    assert [r["key"] for r in seen] == ["a", "b", "c"]
    with pytest.raises(persistlog.KeyUnavailableError):
        persistlog.follow(log_dir, seen.append).poll()


def test_missing_provider(log_dir: str) -> None:
    write(log_dir, rotations=0)
    with pytest.raises(persistlog.KeyUnavailableError) as info:
        restore_state(log_dir)
    e = info.value
    assert not isinstance(e, persistlog.CorruptLogError)
    assert e.key_id == "2026-10" and e.destination == log_dir and e.log == 1 and e.segment and e.offset
    with pytest.raises(persistlog.KeyUnavailableError):
        restore_state(log_dir, recovery="skip")  # not damage: never skipped
    # verify checks all but the GCM tags without a key, and says so.
    status, out, _ = cli("verify", log_dir)
    assert status == 0 and "encrypted batches not opened" in out
    status, out, _ = cli("verify", log_dir, "--key-provider", PROVIDER)
    assert status == 0 and "not opened" not in out
    status, out, _ = cli("info", log_dir, "--json")  # the structure reads without a key
    assert status == 0 and json.loads(out)["ok"]


def test_wrong_key(log_dir: str) -> None:
    write(log_dir, rotations=0)
    with pytest.raises(persistlog.KeyUnavailableError) as info:
        restore_state(log_dir, key_provider=crypt_keys.wrong)
    assert "not the key this batch was sealed with" in str(info.value) and info.value.key_id == "2026-10"
    with pytest.raises(persistlog.KeyUnavailableError, match="no key for key id '2026-10'"):
        restore_state(log_dir, key_provider={}.get)
    status, _, err = cli("dump", log_dir, "--key-provider", "crypt_keys:wrong")
    assert status == 2 and "2026-10" in err


def tamper_ciphertext(log_dir: str) -> tuple[str, int]:
    """Flip one ciphertext byte of a middle record batch and recompute its CRCs and the
    whole hash chain, as someone who can write the bucket can."""
    segments = tamper.load(log_dir)
    seg, index, b = tamper.record_batches(segments)[3]
    b.body = b.body[:-20] + bytes([b.body[-20] ^ 1]) + b.body[-19:]
    tamper.save(log_dir, segments, relink_all=True)
    return seg.name, tamper.offset_of(seg, index)


def test_tampered_ciphertext_with_crc_and_chain_recomputed_is_damage(log_dir: str) -> None:
    write(log_dir, rotations=0, updates=8)
    name, offset = tamper_ciphertext(log_dir)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir, key_provider=provider)
    e = info.value
    assert (e.segment, e.offset) == (name, offset) and "fails authentication" in str(e)
    status, out, _ = cli("verify", log_dir, "--key-provider", PROVIDER)
    assert status == 1 and "fails authentication" in out and f"segment {name} offset {offset}" in out


def test_tampered_header_is_caught_by_the_tag(log_dir: str) -> None:
    write(log_dir, rotations=0, updates=8)
    segments = tamper.load(log_dir)
    seg, index, b = tamper.record_batches(segments)[3]
    b.commit_us += 1  # clear, but bound as associated data
    tamper.save(log_dir, segments, relink_all=True)
    with pytest.raises(persistlog.CorruptLogError, match="fails authentication"):
        restore_state(log_dir, key_provider=provider)


def test_repair_refuses_an_encrypted_log_it_cannot_read(log_dir: str) -> None:
    write(log_dir, rotations=0, updates=8)
    tamper_ciphertext(log_dir)
    before = stored_bytes(log_dir)
    status, _, err = cli("repair", log_dir, "--force")
    assert status == 2 and "repair refused, nothing changed" in err and "2026-10" in err
    assert stored_bytes(log_dir) == before
    # With the key, the damage is found and the usual plan applies.
    status, out, _ = cli("repair", log_dir, "--dry-run", "--key-provider", PROVIDER)
    assert status == 1 and "fails authentication" in out


def test_secrets_never_shown(log_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="persistlog")
    secrets = [k.hex() for k in [*KEYS.values(), *crypt_keys.WRONG.values()]] + [
        repr(k) for k in [*KEYS.values(), *crypt_keys.WRONG.values()]]
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync", key_provider=provider, key_id="2026-10")
    app.put("b", 2)
    shown = [repr(lg), str(lg.stats()), repr(lg.settings.keys)]
    lg.close()
    for bad in (None, crypt_keys.wrong, {}.get):
        try:
            restore_state(log_dir, key_provider=bad)
        except persistlog.KeyUnavailableError as e:
            shown += [str(e), repr(e)]
    shown += [cli("info", log_dir, "--json", "--key-provider", PROVIDER)[1],
              cli("verify", log_dir, "--json", "--key-provider", "crypt_keys:wrong")[2],
              caplog.text]

    def leaky(key_id: str) -> bytes:
        raise RuntimeError(f"vault said {KEYS['2026-10']!r}")

    with pytest.raises(persistlog.KeyUnavailableError) as info:
        restore_state(log_dir, key_provider=leaky)
    shown.append(str(info.value))
    text = "\n".join(shown)
    assert "crypt_keys" in text or "provider" in text
    for s in secrets:
        assert s not in text


def test_key_provider_option_names_an_importable_callable(log_dir: str) -> None:
    write(log_dir, rotations=0)
    status, out, _ = cli("dump", log_dir, "--json", "--key-provider", PROVIDER)
    assert status == 0 and "secret-" in out
    assert cli("restore-check", log_dir, "--key-provider", PROVIDER)[0] == 0
    assert cli("tail", log_dir, "--key-provider", PROVIDER)[0] == 0
    assert cli("restore-check", log_dir)[0] == 2
    for bad in ("crypt_keys", "no_such_module:f", "crypt_keys:nope", "crypt_keys:KEYS"):
        status, _, err = cli("dump", log_dir, "--key-provider", bad)
        assert status == 2 and "--key-provider" in err, bad


def test_the_key_provider_module_is_found_in_the_current_directory(log_dir: str, tmp_path: Any) -> None:
    """As the ``persistlog`` command runs (no current directory on its path: ``-I``), a
    provider module in the directory it runs in is found, as ``python -m`` finds it."""
    write(log_dir, rotations=0)
    app = tmp_path / "app"
    (app / "myapp").mkdir(parents=True)
    (app / "myapp" / "__init__.py").write_text("")
    (app / "myapp" / "keys.py").write_text(f"KEYS = {crypt_keys.KEYS!r}\n\ndef app_keys(key_id):\n    return KEYS[key_id]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-I", "-m", "persistlog", "dump", log_dir, "--json",
                          "--key-provider", "myapp.keys:app_keys"], cwd=app, capture_output=True, text=True,
                         timeout=60, env=env)
    assert run.returncode == 0 and "secret-" in run.stdout, run.stderr
    run = subprocess.run([sys.executable, "-I", "-m", "persistlog", "dump", log_dir,
                          "--key-provider", "otherapp.keys:app_keys"], cwd=app, capture_output=True, text=True,
                         timeout=60, env=env)
    assert run.returncode == 2 and "No module named 'otherapp'" in run.stderr


def test_a_secondary_holds_the_writers_sealed_batches(log_dir: str, tmp_path: Any) -> None:
    backup = str(tmp_path / "backup")
    app = App({"a": 1})
    app.open(log_dir, durability="fsync", secondaries=[backup], key_provider=provider, key_id="2026-10")
    app.put("b", 2)
    app.log.close()  # type: ignore[union-attr]
    assert b"secret" not in stored_bytes(backup)
    sealed = {b.to_bytes() for s in tamper.load(log_dir) for b in s.batches if b.flags & F.FLAG_ENCRYPTED}
    copied = {b.to_bytes() for s in tamper.load(backup) for b in s.batches if b.flags & F.FLAG_ENCRYPTED}
    assert sealed and copied == sealed  # copied byte for byte: never sealed again under a new nonce
    assert restore_state(backup, key_provider=provider)[0] == {"a": 1, "b": 2}
    with pytest.raises(persistlog.KeyUnavailableError):
        restore_state(backup)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=600),
    compression=st.sampled_from([F.COMPRESSION_NONE, F.COMPRESSION_GZIP]),
    linked=st.booleans(),
    key_id=st.sampled_from(sorted(KEYS)),
    flip=st.integers(min_value=0),
)
def test_no_changed_byte_of_a_sealed_batch_is_accepted(
    payload: bytes, compression: int, linked: bool, key_id: str, flip: int
) -> None:
    """A sealed batch reads back exactly; with any one stored byte changed and its CRCs
    fixed, it is damage or a key that does not fit, never other records."""
    keys = Keyring(provider, key_id)
    link = bytes(range(32)) if linked else None
    batch = encoder.frame(payload, 1, F.KIND_UPDATE, 7, 1234, compression, link, keys)
    header = decoder.parse_batch_header(batch[:F.BATCH_HEADER_SIZE], 40)
    assert header.flags & F.FLAG_ENCRYPTED
    assert decoder.check_payload(header, batch[F.BATCH_HEADER_SIZE:], 40, keys) == payload
    stored = bytearray(batch[F.BATCH_HEADER_SIZE:])
    at = (F.LINK_SIZE if linked else 0) + flip % (len(stored) - (F.LINK_SIZE if linked else 0))
    stored[at] ^= 0x01
    changed = dataclasses.replace(header, payload_crc=zlib.crc32(stored))
    with pytest.raises((decoder.Damage, persistlog.KeyUnavailableError)):
        decoder.check_payload(changed, bytes(stored), 40, keys)
    # The clear header fields are bound too: another LSN or commit time fails the tag.
    for moved in (dataclasses.replace(header, first_lsn=8), dataclasses.replace(header, commit_us=1235)):
        with pytest.raises(decoder.Damage, match="fails authentication"):
            decoder.check_payload(moved, batch[F.BATCH_HEADER_SIZE:], 40, keys)


def test_a_crash_with_a_torn_sealed_batch_and_a_reopen(log_dir: str) -> None:
    """A batch a crash left half-written is a torn tail, encrypted too (its CRC fails before
    anything is decrypted): dropped, everything before it restored, and the next writer
    starts a new log (under a new key id here)."""
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync", key_provider=provider, key_id="2026-10")
    app.put("b", 2, sync=True)
    app.put("c", 3, sync=True)
    crash(lg)
    newest = os.path.join(log_dir, sorted(n for n in os.listdir(log_dir) if n.endswith(".plog"))[-1])
    truncate(newest, os.path.getsize(newest) - 5)  # cut inside the last batch, as a crash mid-write
    state, result = restore_state(log_dir, key_provider=provider)
    assert state == {"a": 1, "b": 2} and len(result.torn_tails) == 1
    app2 = App(state)
    app2.open(log_dir, durability="fsync", key_provider=provider, key_id="2026-11")
    app2.put("d", 4, sync=True)
    app2.log.close()  # type: ignore[union-attr]
    assert restore_state(log_dir, key_provider=provider)[0] == {"a": 1, "b": 2, "d": 4}
    assert cli("verify", log_dir, "--key-provider", PROVIDER)[0] == 1  # the torn tail is reported
    assert cli("verify", log_dir, "--key-provider", PROVIDER, "--torn-ok")[0] == 0


def test_an_auditor_proves_an_encrypted_log_with_the_public_key_alone(log_dir: str, tmp_path: Any) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signing = Ed25519PrivateKey.generate()
    public = tmp_path / "writer.pub"
    public.write_bytes(signing.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    write(log_dir, rotations=0, updates=8, signing_key=signing)
    status, out, _ = cli("verify", log_dir, "--public-key", str(public))
    assert status == 0 and "\nPROVEN:" in "\n" + out and "not opened" in out
    from persistlog._format.signing import Signer
    status, out, _ = cli("info", log_dir)
    assert status == 0 and f"signed       key {Signer(signing).key_id}" in out and "encrypted    key 2026-10" in out
    # Ciphertext changed, CRCs and the whole chain recomputed: no key is needed to see it.
    tamper_ciphertext(log_dir)
    status, out, _ = cli("verify", log_dir, "--public-key", str(public))
    assert status == 1 and "\nPROVEN:" not in "\n" + out and ("BROKEN" in out or "UNPROVEN" in out)


def test_an_encrypted_queue_delivers_across_a_rotation_and_a_restart(tmp_path: Any) -> None:
    # The queue reads each body back from its log: those reads, its restore and the
    # rotation's copy of what is not acknowledged all open sealed batches with its keys.
    url = str(tmp_path / "q")
    options: dict[str, Any] = {"key_provider": provider, "key_id": "2026-11", "rotate_records": 4}
    with persistlog.Queue.open(url, **options) as q:
        for i in range(10):
            q.send(b"secret-%d" % i)
        assert q.receive() == persistlog.Message(1, b"secret-0")
        assert q.ack(1) is True
        assert q.log.stats()["rotations"] >= 1
    assert b"secret-" not in stored_bytes(url)
    with pytest.raises(persistlog.KeyUnavailableError):
        persistlog.Queue.open(url)
    with persistlog.Queue.open(url, **options) as q:
        assert [m.body for m in iter(q.receive, None)] == [b"secret-%d" % i for i in range(1, 10)]
    root = str(tmp_path / "set")
    with persistlog.LogSet(root, key_provider=provider, key_id="2026-10") as logs:
        q = persistlog.Queue.open_in(logs, "alice")
        q.send(b"secret-a")
    with persistlog.LogSet(root, key_provider=provider, key_id="2026-10") as logs:
        q = persistlog.Queue.open_in(logs, "alice")
        assert q.receive() == persistlog.Message(1, b"secret-a")
