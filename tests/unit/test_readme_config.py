"""The configuration shown in README.md is a valid configuration (the README stays true)."""

from __future__ import annotations

import re
from pathlib import Path

from policies.config import parse_config_text

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_example_parses():
    """The README's YAML example passes the same validation `interlock check-config` applies."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md shows a config example"
    config = parse_config_text(blocks[0], "README.md", environ={"OPENAI_API_KEY": "sk-test"})
    assert set(config.upstreams) == {"mail", "files", "openai"}
    assert config.tools[0].cost_class == "email"
