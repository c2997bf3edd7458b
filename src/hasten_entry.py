"""The `hasten` command's entry point. Importing hasten takes a second or two (torch); a
Ctrl-C in that time ends the command with one line instead of a traceback, which only a
module outside the package can catch (importing any part of hasten runs its imports first)."""
import sys


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        # answered from the installed package's metadata, without importing torch: instant
        from importlib.metadata import PackageNotFoundError, version
        try:
            print(f"hasten {version('hasten')}")
            return 0
        except PackageNotFoundError:   # run from a source tree that is not installed
            pass
    try:
        from hasten.cli import main as hasten_main
    except KeyboardInterrupt:
        print("hasten: interrupted", file=sys.stderr)
        return 130
    return hasten_main()


if __name__ == "__main__":
    sys.exit(main())
