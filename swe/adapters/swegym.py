"""SWE-Gym (SWE-Gym/SWE-Gym, SumanthRH/SWE-Gym-Subset): SWE-bench's format and grading on other
repositories.

Rows: SWE-bench's fields minus environment_setup_commit, FAIL_TO_PASS / PASS_TO_PASS as real
lists; the Subset also carries `eval_script` and an image name. Shape: base_commit, test_patch
or version (SWE-bench's fields) without `environment_setup_commit`.

- image: `docker.io/xingyaoww/sweb.eval.x86_64.<instance_id, "__" -> "_s_">:latest`, lower case,
  or the row's own `image_name`;
- test command: the row's `eval_script`, else the swebench harness's for the repo and version
  (swebench 4.1 knows few SWE-Gym repos: such a row must carry its eval_script, and says so);
- log parser and resolution: SWE-bench's (SWE-Gym's harness is a fork of it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from swe.adapters.base import register
from swe.adapters.swebench import SweBenchFormat, foreign_shape
from swe.adapters.swesmith import smith_shape

# Fields of SWE-bench's format that SWE-Gym rows carry and other families' do not.
_SWE_FIELDS = ("base_commit", "test_patch", "version")


@register
class SweGym(SweBenchFormat):
    family = "swe-gym"
    aliases = ("swegym",)
    hub_datasets: ClassVar[dict[str, str]] = {"SWE-Gym/SWE-Gym": "train", "SumanthRH/SWE-Gym-Subset": "train"}
    description = ("SWE-Gym: SWE-bench's format and grading, xingyaoww/ images, the row's own "
                   "eval_script where the harness does not know the repo")

    def matches(self, row: dict[str, Any]) -> bool:
        return ("environment_setup_commit" not in row and not foreign_shape(row)
                and not smith_shape(row) and any(f in row for f in _SWE_FIELDS))

    def fallback_for(self, row: dict[str, Any]) -> bool:
        # a row no family claims but that has an instance_id and none of another family's marks
        # is read in SWE-bench's format (a user's own rows: the issue, test lists, often their
        # own eval_script and image), so a missing field is named as that format's
        return "instance_id" in row and "environment_setup_commit" not in row \
            and not foreign_shape(row) and not smith_shape(row)

    def image_name(self, row: dict[str, Any]) -> str:
        if row.get("image_name"):
            return str(row["image_name"])
        return f"docker.io/xingyaoww/sweb.eval.x86_64.{row['instance_id'].replace('__', '_s_')}:latest".lower()
