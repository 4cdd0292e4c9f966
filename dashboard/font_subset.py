"""Build the dashboard's CJK font: Noto Sans SC cut to the characters the dashboard uses.

Run ``python -m dashboard.font_subset`` after changing any Chinese text (lessons, the
dictionary in :mod:`dashboard.zh`, page strings); ``tests/dashboard/test_i18n.py`` fails
while a character is missing. Needs fontTools (the ``dev`` extra) and Debian's
``fonts-noto-cjk`` (or ``--source`` pointing at a Noto Sans CJK ``.ttc``/``.otf``); the
built ``dashboard/static/NotoSansSC-servelab.woff`` is committed, so running the dashboard
needs neither. The subset is a Modified Version under the SIL Open Font License 1.1
(``dashboard/static/OFL.txt``): it is renamed so it carries no Reserved Font Name.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent
OUT = DASHBOARD / "static" / "NotoSansSC-servelab.woff"
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
FAMILY = "Servelab CJK Subset"
# what the subset must hold beyond the sources' own text: CJK punctuation and full-width forms
EXTRA = "，。、：；！？（）《》“”‘’—…·「」【】～％＋－／＝０１２３４５６７８９"
_WIDE = re.compile(r"[\u2000-\u206f\u2e80-\u2fff\u3000-\u303f\u3400-\u9fff\uf900-\ufaff"
                   r"\uff00-\uffef]")


def needed_characters(root: Path = DASHBOARD) -> set[str]:
    """Every CJK code point (ranges of :data:`dashboard.i18n.CJK_RANGE`) in the dashboard's
    Python sources, plus :data:`EXTRA`.
    """
    chars = set(EXTRA)
    for path in sorted(root.rglob("*.py")):
        chars.update(_WIDE.findall(path.read_text(encoding="utf-8")))
    return chars


def build(source: Path = SOURCE, out: Path = OUT) -> int:
    """Subset ``source`` (its Simplified Chinese face) to :func:`needed_characters`, rename
    it and write WOFF to ``out``; returns the number of characters kept.
    """
    from fontTools import subset  # type: ignore[import-untyped]
    from fontTools.ttLib import TTCollection, TTFont  # type: ignore[import-untyped]

    if source.suffix == ".ttc":
        faces = TTCollection(str(source)).fonts
        font = next(f for f in faces if f["name"].getDebugName(1) == "Noto Sans CJK SC")
    else:
        font = TTFont(str(source))
    chars = needed_characters()
    options = subset.Options()
    options.flavor = "woff"
    options.layout_features = ["*"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in chars])
    subsetter.subset(font)
    names = font["name"]
    for record in list(names.names):
        if record.nameID in (1, 4, 16):
            names.setName(FAMILY, record.nameID, record.platformID, record.platEncID,
                          record.langID)
        elif record.nameID == 6:
            names.setName(FAMILY.replace(" ", "-"), 6, record.platformID, record.platEncID,
                          record.langID)
        elif record.nameID == 3:
            names.setName(f"{FAMILY}; subset of Noto Sans CJK SC", 3, record.platformID,
                          record.platEncID, record.langID)
    out.parent.mkdir(parents=True, exist_ok=True)
    options.flavor = "woff"
    font.flavor = "woff"
    font.save(str(out))
    return len(chars)


def main() -> None:
    """Command line: build the subset."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE,
                        help="Noto Sans CJK .ttc or Noto Sans SC .otf")
    args = parser.parse_args()
    if not args.source.exists():
        sys.exit(f"--source: {args.source} not found (apt-get install fonts-noto-cjk)")
    kept = build(args.source)
    print(f"{OUT}: {kept} characters, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
