"""The embedded tiny models: trained by the scripts beside this file, shipped in models/."""
from pathlib import Path

MODELS_DIR = Path(__file__).with_name("models")
TARGET_DIR = MODELS_DIR / "tiny-target"
DRAFT_DIR = MODELS_DIR / "tiny-draft"
EAGLE_DIR = MODELS_DIR / "tiny-eagle"
MTP_DIR = MODELS_DIR / "tiny-mtp"
EAGLE3_DIR = MODELS_DIR / "tiny-eagle3"
FROZEN_KV_MTP_DIR = MODELS_DIR / "tiny-frozen-kv-mtp"
MEDUSA_DIR = MODELS_DIR / "tiny-medusa"
DFLASH_DIR = MODELS_DIR / "tiny-dflash"
