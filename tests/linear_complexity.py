"""Linear's documented query-cost model, shared by the fake Linear, its tests and the
budget benchmark (so all three charge a query the same points).

The model (https://linear.app/developers/rate-limiting): 0.1 point per scalar
field, 1 per object, and a connection multiplies the cost of its children by
``first``/``last`` (50 when neither is given); the total is rounded up.
Assumptions where the page is silent: ``pageInfo`` is counted once per
connection (it is not repeated per node), a list of objects that is not a
connection counts once, and a mutation costs what its selection costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    GraphQLObjectType,
    GraphQLSchema,
    OperationDefinitionNode,
    SelectionSetNode,
    get_named_type,
    is_leaf_type,
    parse,
)

DEFAULT_PAGE = 50
"""What Linear assumes for a connection asked without ``first``/``last``."""
SINGLE_QUERY_CAP = 10_000
"""Above this Linear rejects a query outright."""


def _page_size(field: FieldNode, variables: Mapping[str, Any]) -> int:
    for arg in field.arguments or ():
        if arg.name.value in ("first", "last"):
            value = arg.value
            if value.kind == "variable":
                given = variables.get(value.name.value)  # type: ignore[attr-defined]
                return DEFAULT_PAGE if given is None else int(given)
            if value.kind == "int_value":
                return int(value.value)  # type: ignore[attr-defined]
    return DEFAULT_PAGE


def _is_connection(parent: GraphQLObjectType, name: str) -> bool:
    field = parent.fields[name]
    return get_named_type(field.type).name.endswith("Connection") and (
        "first" in field.args or "last" in field.args)


def complexity(schema: GraphQLSchema, document: str,
               variables: Mapping[str, Any] | None = None,
               operation_name: str | None = None) -> int:
    """The points Linear charges for ``document`` run with ``variables``."""
    variables = variables or {}
    doc = parse(document)
    fragments = {d.name.value: d for d in doc.definitions
                 if isinstance(d, FragmentDefinitionNode)}
    ops = [d for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is not None:
        ops = [o for o in ops if o.name is not None and o.name.value == operation_name]
    if len(ops) != 1:
        raise ValueError("the document must hold exactly one (named) operation")
    op = ops[0]
    root = schema.mutation_type if op.operation.value == "mutation" else schema.query_type
    assert root is not None

    def cost(selection_set: SelectionSetNode, parent: GraphQLObjectType) -> float:
        total = 0.0
        for sel in selection_set.selections:
            if sel.kind == "fragment_spread":
                total += cost(fragments[sel.name.value].selection_set, parent)  # type: ignore[attr-defined]
                continue
            if sel.kind == "inline_fragment":
                condition = sel.type_condition  # type: ignore[attr-defined]
                target = schema.type_map[condition.name.value] if condition else parent
                total += cost(sel.selection_set, target)  # type: ignore[arg-type, attr-defined]
                continue
            assert isinstance(sel, FieldNode)
            name = sel.name.value
            if name == "__typename":
                total += 0.1
                continue
            named = get_named_type(parent.fields[name].type)
            if is_leaf_type(named) or sel.selection_set is None:
                total += 0.1
                continue
            assert isinstance(named, GraphQLObjectType), f"{name}: abstract types not modelled"
            if not _is_connection(parent, name):
                total += 1 + cost(sel.selection_set, named)
                continue
            per_page = 0.0
            once = 0.0
            for inner in sel.selection_set.selections:
                part = SelectionSetNode(selections=(inner,))
                if isinstance(inner, FieldNode) and inner.name.value == "pageInfo":
                    once += cost(part, named)
                else:
                    per_page += cost(part, named)
            total += 1 + per_page * _page_size(sel, variables) + once
        return total

    return math.ceil(round(cost(op.selection_set, root), 6))
