"""``python -m spark_replay URL --out DIR``: see :mod:`spark_replay._job`."""

import sys

from spark_replay._job import main

if __name__ == "__main__":
    sys.exit(main())
