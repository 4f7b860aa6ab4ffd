import sys

from hpctrain.cli import main

sys.exit(main())
