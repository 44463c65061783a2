"""`python -m gateway ...` is the `gateway` command line."""

from .cli import main

if __name__ == "__main__":
    main()
