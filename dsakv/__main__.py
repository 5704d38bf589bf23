import sys

from dsakv.cli import main

sys.exit(main())
