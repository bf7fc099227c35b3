"""``python -m persistlog``: the same command as the ``persistlog`` console script."""

from persistlog.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
