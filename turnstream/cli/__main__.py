"""`python -m turnstream.cli ...`: how the launcher, torchrun and the deployments start a role process."""
import sys

from turnstream.cli.program import main

sys.exit(main())
