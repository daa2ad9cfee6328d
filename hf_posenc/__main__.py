"""``python -m hf_posenc`` (and ``accelerate launch -m hf_posenc``) is the ``hf-posenc`` command."""

from hf_posenc.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
