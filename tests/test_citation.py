"""What an instructor or a forker checks first: a licence, and a citation file that cites the
project and the paper."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_licence_and_citation():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT" and cff["type"] == "software"
    assert cff["title"] and cff["authors"] and cff["message"]
    paper = cff["references"][0]
    assert "arXiv:2604.01597" in [i["value"] for i in paper["identifiers"]]
    assert [a["family-names"] for a in paper["authors"]] == ["Shu", "Zhang", "Hullman"]
