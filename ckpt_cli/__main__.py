"""Entry point for ``python -m ckpt_cli``."""

from ckpt_cli.app import main

if __name__ == "__main__":
    main()
