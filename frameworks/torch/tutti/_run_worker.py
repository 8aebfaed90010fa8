"""`python -m tutti._run_worker DIR`: one rank of a tutti.run job (tutti/runner.py)."""

import sys

from tutti.runner import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
