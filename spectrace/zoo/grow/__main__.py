import sys

from spectrace.zoo.grow import main

sys.exit(main())
