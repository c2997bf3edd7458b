"""`python -m hasten ...`: the `hasten` command, for an environment whose scripts folder is
not on PATH."""
import sys

if __name__ == "__main__":
    from hasten.cli import main
    sys.exit(main())
