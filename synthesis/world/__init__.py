"""A simulated backend for the agent's own tools: roles, generated records, tool semantics.

Every environment family works on the same small world, built from the `Catalog` inferred from
the traces:

    finder (user-facing attributes -> owner id)        find_user_id_by_name_zip(first_name, ...)
      -> owner lookup (owner id -> record listing ids)  get_user_details(user_id) .orders[*]
        -> lookup (entity id -> entity record)          get_order_details(order_id)
          -> action (a write on the entity)             cancel_pending_order(order_id, reason)

`infer_roles` finds these roles from the mined data flows (names only as a fallback); any of
finder / owner lookup may be missing. Records are generated from the recorded result shapes, with
ids, owner links, labels (`items[*].name`) and the values the action's other arguments need
planted where the traces say they come from (`payment_history[*].payment_method_id`). Every
other recorded tool stays callable: reads answer from their result shape, deterministically per
arguments; writes land in the state (and so break the state hash: side effects count).

Everything generated is what the traces could have shown (`synthesis.fidelity` checks it): ids
in the formats every schema that takes them shares, enum-like strings, names and statuses from
the observed values only, dates inside the observed range and order, numbers inside their range
and precision. A read returns the record asked for (the field the traces showed echoing the
argument holds it); the action stores what its arguments name (`write_paths`) and answers in
its recorded result shape; a status rule is one mined from the runs or none (`synthetic_status`
only lends a record's observed status values, with no rule).
"""

from __future__ import annotations

from tracegym.synthesis.spec import formats_of, is_id_value, is_wordlike
from tracegym.synthesis.world.arithmetic import (
    calculate,
)
from tracegym.synthesis.world.backend import (
    MEMORY_TOOLS,
    ToolWorld,
    public_state,
    replace_at,
    write_fills,
    write_paths,
)
from tracegym.synthesis.world.builder import (
    WorldBuilder,
    echo_field,
    label_pool,
    leaf_paths,
    leaf_paths_cached,
    loosen,
    money,
    shared_formats,
    sibling_descriptor,
)
from tracegym.synthesis.world.errors import (
    FALLBACK_LABELS,
    LABEL_NAMES,
    MEMORY_SEARCH,
    MEMORY_UPDATE,
    NotSynthesizable,
    ToolError,
)
from tracegym.synthesis.world.json_paths import (
    canonical,
    canonical_value,
    clone,
    digest,
    get_all,
    path_tokens,
    set_at,
    shape_at,
)
from tracegym.synthesis.world.roles import (
    STATUS_FIELD,
    Roles,
    infer_roles,
    observed_statuses,
    synthetic_status,
)
from tracegym.synthesis.world.state import (
    WorldState,
)
from tracegym.synthesis.world.values import (
    Gen,
    Maker,
    agree,
    compile_shape,
    fits,
    key_kinds,
)

__all__ = [
    "FALLBACK_LABELS",
    "LABEL_NAMES",
    "MEMORY_SEARCH",
    "MEMORY_TOOLS",
    "MEMORY_UPDATE",
    "STATUS_FIELD",
    "Gen",
    "Maker",
    "NotSynthesizable",
    "Roles",
    "ToolError",
    "ToolWorld",
    "WorldBuilder",
    "WorldState",
    "agree",
    "calculate",
    "canonical",
    "canonical_value",
    "clone",
    "compile_shape",
    "digest",
    "echo_field",
    "fits",
    "formats_of",
    "get_all",
    "infer_roles",
    "is_id_value",
    "is_wordlike",
    "key_kinds",
    "label_pool",
    "leaf_paths",
    "leaf_paths_cached",
    "loosen",
    "money",
    "observed_statuses",
    "path_tokens",
    "public_state",
    "replace_at",
    "set_at",
    "shape_at",
    "shared_formats",
    "sibling_descriptor",
    "synthetic_status",
    "write_fills",
    "write_paths",
]
