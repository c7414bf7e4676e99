"""Learning quality, sync vs async, at equal samples: ``streamrl bench quality`` (see
``streamrl/bench/quality.py``); this script is the same command."""

from streamrl.bench.quality import main

if __name__ == "__main__":
    main()
