"""`python -m ssd_chat` runs the same CLI as the `ssd-chat` console script."""

from ssd_chat.cli import main

main()
