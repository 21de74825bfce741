"""Which ``TypedDict`` each command's ``--json`` document is: what the schema generator
(``_schemas.py``) publishes. Each type sits beside the result that builds it.
"""

from __future__ import annotations


def documents() -> dict[str, object]:
    """command -> the TypedDict of its document. Imported here, not at module level, so that
    ``ckpt --help`` never loads the result types."""
    from ckpt_cli.core.copy.plan import CpJSON
    from ckpt_cli.core.diff import DiffJSON
    from ckpt_cli.core.format.pins import PinResultJSON
    from ckpt_cli.core.inspect import InspectJSON, StepInspectJSON
    from ckpt_cli.core.listing import LsJSON
    from ckpt_cli.core.migrate.plan import MigrateJSON
    from ckpt_cli.core.prune.execute import PruneJSON
    from ckpt_cli.core.reshard.plan import ReshardJSON
    from ckpt_cli.core.safetensors.export_run import ExportJSON
    from ckpt_cli.core.safetensors.import_run import ImportJSON
    from ckpt_cli.core.verify.types import VerifyJSON

    return {
        "ls": LsJSON,
        "inspect": InspectJSON | StepInspectJSON,
        "verify": VerifyJSON,
        "diff": DiffJSON,
        "prune": PruneJSON,
        "reshard": ReshardJSON,
        "migrate": MigrateJSON,
        "export": ExportJSON,
        "import": ImportJSON,
        "pin": PinResultJSON,
        "unpin": PinResultJSON,
        "cp": CpJSON,
    }
