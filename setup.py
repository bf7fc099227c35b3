"""The one thing setup.cfg cannot say: the optional C accelerator for records as JSON,
for the batch buffer's append and for a reader's batch checks.

Without a compiler the build goes on without it, and the same text comes from the
Python path (persistlog/_format/jsonify.py), the same appends from persistlog/_write/batch_buffer.py
and the same verdicts from persistlog/_format/decoder.py, only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "persistlog._cbor_json",
            ["persistlog/_cbor_json.c"],
            optional=True,
        )
    ]
)
