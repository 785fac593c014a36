"""A run's models, found and loaded (the application layer):

    hub.py        a hub name resolved from the local cache (no download)
    tokenizer.py  tokenizer.json and the chat template, as transformers reads them
    formats.py    FORMATS: a row per checkpoint format, its loader and the drafter of each engine
    models.py     find_model, the memory check against --mem-fraction-static, load_models
"""
