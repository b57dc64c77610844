"""Which payload names are safe: one rule for writers (``save``) and readers (manifests).

Apart from both, so the manifest can judge the names it reads back without importing
the payload code that imports it.
"""

from __future__ import annotations

import unicodedata

from spot_core.checkpoint.file_backend import TEMP_PREFIX

MANIFEST_NAME = "MANIFEST.json"
MAX_PART_BYTES = 255  # NAME_MAX of common file systems


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a safe payload name, or None. Also how readers judge a manifest's
    names, so a forged one cannot make ``load_to_dir`` write outside its directory."""
    if not name:
        return "is empty"
    if "\x00" in name:
        return "contains a NUL character"
    odd = next((c for c in name if _invisible(c)), None)
    if odd is not None:
        return (
            f"contains the control, format or separator character U+{ord(odd):04X} "
            "(it would hide or reorder what a listing shows)"
        )
    if "\\" in name:
        return "contains a backslash (use '/' to separate directories)"
    if name.startswith("/"):
        return "is absolute (drop the leading '/')"
    parts = name.split("/")
    if any(p in (".", "..") for p in parts):
        return "contains a '.' or '..' part (it would escape the checkpoint directory)"
    if any(not p for p in parts):
        return "has an empty part ('//' or a trailing '/')"
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES for p in parts):
        return f"has a part longer than {MAX_PART_BYTES} bytes (file systems refuse it)"
    if name == MANIFEST_NAME:
        return "is reserved for the checkpoint manifest (rename the entry)"
    if any(p.startswith(TEMP_PREFIX) for p in parts):
        return f"starts with the reserved prefix {TEMP_PREFIX!r}"
    return None


def _invisible(char: str) -> bool:
    """Unicode control (Cc: C0, DEL, C1 such as U+0085 NEL), format (Cf: bidi overrides
    and isolates such as U+202E, zero-width characters, U+FEFF), line and paragraph
    separators (U+2028, U+2029), and lone surrogates (no file system can store them)."""
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")
