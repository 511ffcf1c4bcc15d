"""`python -m kernelcraft.cli ...` runs the `kernelcraft` command."""
from kernelcraft.cli import main

main()
