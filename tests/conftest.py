# --- destinations fixtures (moto S3 server, clean memory://): see tests/conftest_s3.py ---
from conftest_s3 import clean_memory_fs, moto_server, s3_bucket, s3_storage_options  # noqa: E402,F401
