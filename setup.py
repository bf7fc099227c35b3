"""The one thing setup.cfg cannot say: the optional C accelerator for records as JSON
and for the batch buffer's append.

Without a compiler the build goes on without it, and the same text comes from the
Python path (persistlog/_format/jsonify.py), and the same appends from persistlog/_write/batch_buffer.py,
only slower.
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
