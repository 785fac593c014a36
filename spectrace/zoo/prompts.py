"""Built-in prompts: openings of functions from held-out files of the pinned corpus.

None of these files was trained on (see corpus_manifest.tsv, split "heldout"), so continuations
and acceptance measured on them are held-out numbers. Lengths differ on purpose: a batch of them
exercises ragged prefill and ragged acceptance. Trailing newlines are cut: byte-level BPE merges
a newline with the indentation after it, so a prompt that ends in "\n" starts the model on a
token boundary it never saw in training.
"""

_PROMPTS = [
    # secrets.py:48-50
    'def token_hex(nbytes=None):\n    """Return a random text string, in hexadecimal.\n\n',
    # getopt.py:207-209
    "def short_has_arg(opt, shortopts):\n    for i in range(len(shortopts)):\n        if opt == shortopts[i] != ':':\n",
    # html/__init__.py:12-13
    'def escape(s, quote=True):\n    """\n',
    # py_compile.py:72-74
    "def _get_default_invalidation_mode():\n    if os.environ.get('SOURCE_DATE_EPOCH'):\n        return PycInvalidationMode.CHECKED_HASH\n",
    # types.py:77-82
    'def resolve_bases(bases):\n    """Resolve MRO entries dynamically as specified by PEP 560."""\n    new_bases = list(bases)\n    updated = False\n    shift = 0\n    for i, base in enumerate(bases):\n',
    # getopt.py:171-176
    "def long_has_args(opt, longopts):\n    possibilities = [o for o in longopts if o.startswith(opt)]\n    if not possibilities:\n        raise GetoptError(_('option --%s not recognized') % opt, opt)\n    # Is there an exact match?\n    if opt in possibilities:\n",
    # secrets.py:26-29
    'def randbelow(exclusive_upper_bound):\n    """Return a random int in the range [0, n)."""\n    if exclusive_upper_bound <= 0:\n        raise ValueError("Upper bound must be positive.")\n',
    # types.py:98-106
    'def prepare_class(name, bases=(), kwds=None):\n    """Call the __prepare__ method of the appropriate metaclass.\n\n    Returns (metaclass, namespace, kwds) as a 3-tuple\n\n    *metaclass* is the appropriate metaclass\n    *namespace* is the prepared class namespace\n    *kwds* is an updated copy of the passed in kwds argument with any\n    \'metaclass\' entry removed. If no kwds argument is passed in, this will\n',
]

HELD_OUT_PROMPTS = [p.rstrip("\n") for p in _PROMPTS]

# Code that repeats itself: what n-gram drafting is for. Not from the corpus; a class whose
# accessors follow one pattern, cut where the next one starts.
REPEATING_PROMPTS = [
    "class Point:\n    def __init__(self, x, y, z):\n        self.x = x\n        self.y = y\n        self.z = z\n\n"
    "    def get_x(self):\n        return self.x\n\n    def get_y(self):\n        return self.y\n\n"
    "    def get_z(self):\n        return self.z\n\n    def set_x(self, value):\n        self.x = value\n\n"
    "    def set_y(self, value):",
]
