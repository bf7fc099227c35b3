"""The one thing setup.cfg cannot say: the optional C accelerator for records as JSON.

Without a compiler the build goes on without it, and the same text comes from the
Python path (persistlog/_jsonify.py), only slower.
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
