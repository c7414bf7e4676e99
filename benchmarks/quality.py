"""Learning quality per arm (sync, async at η = 1, 2, 4, uncorrected, ...) over seeds:
``streamrl bench quality`` (see ``streamrl/bench/quality.py``); this script is the same
command."""

import sys

from streamrl.bench.quality import main

if __name__ == "__main__":
    sys.exit(main())
