"""`python -m turnstream.cli ...`: how the launcher, torchrun and the deployments start a role process."""
import sys

from turnstream.cli.program import main

if __name__ == "__main__":  # importing every module (the wheel's check) must not run the command line
    sys.exit(main())
