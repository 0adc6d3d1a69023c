"""The Linear client's documents and the fake's SDL, held to Linear's real schema.

The real schema (49,840 lines) is parsed once per session. It is not in the
repository: tests find it through ``RALPH_DEV_LINEAR_SCHEMA`` or beside the
clone (``../shared/linear/schema.graphql``) and skip, saying so, without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from graphql import (
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    build_schema,
    parse,
    validate,
)

from ralph_dev.adapters.tracker.linear import client, tracker

REPO = Path(__file__).resolve().parent.parent
FAKE_SDL = Path(__file__).with_name("fake_linear.graphql")


def real_schema_path() -> Path | None:
    for candidate in (os.environ.get("RALPH_DEV_LINEAR_SCHEMA"),
                      str(REPO.parent / "shared/linear/schema.graphql")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def real_schema() -> GraphQLSchema:
    path = real_schema_path()
    if path is None:
        pytest.skip("Linear's schema.graphql not found: set RALPH_DEV_LINEAR_SCHEMA or put "
                    "shared/linear/schema.graphql beside the clone")
    return build_schema(path.read_text())


@pytest.fixture(scope="session")
def fake_schema() -> GraphQLSchema:
    return build_schema(FAKE_SDL.read_text())


def test_operations_are_found() -> None:
    names = client.operations()
    for expected in ("Viewer", "Projects", "ProjectIssues", "ProjectChanges", "IssueUpdate",
                     "CommentCreate", "IssueCreate", "IssueRelationCreate", "IssueLabelCreate"):
        assert expected in names


@pytest.mark.parametrize("operation", client.operations())
def test_document_is_one_named_operation_valid_against_real_schema(
    operation: str, real_schema: GraphQLSchema
) -> None:
    doc = parse(client.document(operation))
    ops = [d for d in doc.definitions if d.kind == "operation_definition"]
    assert len(ops) == 1
    assert ops[0].name is not None and ops[0].name.value == operation
    errors = validate(real_schema, doc)
    assert errors == [], [e.message for e in errors]


@pytest.mark.parametrize("operation", client.operations())
def test_document_is_valid_against_fake_schema(operation: str,
                                               fake_schema: GraphQLSchema) -> None:
    """The fake can answer everything the client sends."""
    errors = validate(fake_schema, parse(client.document(operation)))
    assert errors == [], [e.message for e in errors]


def test_a_broken_document_is_caught(real_schema: GraphQLSchema) -> None:
    """The validation above can fail: a misspelt field is reported."""
    errors = validate(real_schema, parse("query X { viewer { idd } }"))
    assert errors


def subset_problems(fake: GraphQLSchema, real: GraphQLSchema) -> list[str]:
    problems: list[str] = []
    for name, ftype in fake.type_map.items():
        if name.startswith("__"):
            continue
        rtype = real.type_map.get(name)
        if rtype is None:
            problems.append(f"type {name} is not in the real schema")
            continue
        if type(rtype) is not type(ftype):
            problems.append(f"type {name} is a {type(ftype).__name__} in the fake, "
                            f"{type(rtype).__name__} in the real schema")
            continue
        if isinstance(ftype, GraphQLObjectType | GraphQLInterfaceType):
            assert isinstance(rtype, GraphQLObjectType | GraphQLInterfaceType)
            for fname, field in ftype.fields.items():
                rfield = rtype.fields.get(fname)
                if rfield is None:
                    problems.append(f"field {name}.{fname} is not in the real schema")
                    continue
                if str(rfield.type) != str(field.type):
                    problems.append(f"field {name}.{fname}: {field.type} vs real {rfield.type}")
                for aname, arg in field.args.items():
                    rarg = rfield.args.get(aname)
                    if rarg is None or str(rarg.type) != str(arg.type):
                        problems.append(f"argument {name}.{fname}({aname}) differs or is missing")
                for aname, rarg in rfield.args.items():
                    if str(rarg.type).endswith("!") and aname not in field.args:
                        problems.append(f"required argument {name}.{fname}({aname}) missing")
        elif isinstance(ftype, GraphQLInputObjectType):
            assert isinstance(rtype, GraphQLInputObjectType)
            for fname, field in ftype.fields.items():
                rfield = rtype.fields.get(fname)
                if rfield is None or str(rfield.type) != str(field.type):
                    problems.append(f"input field {name}.{fname} differs or is missing")
        elif isinstance(ftype, GraphQLEnumType):
            assert isinstance(rtype, GraphQLEnumType)
            for value in ftype.values:
                if value not in rtype.values:
                    problems.append(f"enum value {name}.{value} is not in the real schema")
    return problems


def test_fake_sdl_is_a_true_subset(fake_schema: GraphQLSchema,
                                   real_schema: GraphQLSchema) -> None:
    assert subset_problems(fake_schema, real_schema) == []


def test_subset_check_catches_differences(real_schema: GraphQLSchema) -> None:
    wrong = build_schema(
        "type Query { viewer: User! issue(id: String!): Issue }\n"
        "type User { id: ID! nickname: String }\n"
        "type Issue { id: ID! priority: Int! }\n"
        "enum IssueRelationType { blocks blocked_by }\n"
        "type Mutation { x: IssueRelationType }"
    )
    problems = subset_problems(wrong, real_schema)
    text = "\n".join(problems)
    assert "User.nickname" in text
    assert "Query.issue" in text  # Issue vs real Issue!
    assert "Issue.priority" in text  # Int! vs real Float!
    assert "blocked_by" in text


def complexity(schema: GraphQLSchema, operation: str, variables: dict[str, int]) -> float:
    """Linear's documented cost model: 1 per object, 0.1 per scalar field, a connection
    multiplies its nodes by ``first`` (default 50), ``pageInfo`` counted once."""
    from graphql import get_named_type, is_leaf_type, parse

    doc = parse(client.document(operation))
    fragments = {d.name.value: d for d in doc.definitions
                 if d.kind == "fragment_definition"}
    (op,) = [d for d in doc.definitions if d.kind == "operation_definition"]
    root = schema.mutation_type if op.operation.value == "mutation" else schema.query_type

    def first_of(field_node) -> int:  # type: ignore[no-untyped-def]
        for arg in field_node.arguments:
            if arg.name.value == "first":
                if arg.value.kind == "variable":
                    return variables[arg.value.name.value]
                return int(arg.value.value)
        return 50

    def cost(selection_set, parent) -> float:  # type: ignore[no-untyped-def]
        total = 0.0
        for sel in selection_set.selections:
            if sel.kind == "fragment_spread":
                frag = fragments[sel.name.value]
                total += cost(frag.selection_set, parent)
                continue
            field = parent.fields[sel.name.value]
            named = get_named_type(field.type)
            if is_leaf_type(named):
                total += 0.1
                continue
            inner = cost(sel.selection_set, named)
            if "first" in field.args:
                paged = [s for s in sel.selection_set.selections
                         if getattr(s, "name", None) and s.name.value == "pageInfo"]
                info = sum(cost(p.selection_set, schema.type_map["PageInfo"]) + 1
                           for p in paged)
                total += 1 + (inner - info) * first_of(sel) + info
            else:
                total += 1 + inner
        return total

    return cost(op.selection_set, root)


def test_every_query_stays_under_the_complexity_cap(fake_schema: GraphQLSchema) -> None:
    firsts = {"Projects": tracker.PROJECTS_PAGE, "Labels": tracker.LABELS_PAGE}
    costs = {op: complexity(fake_schema, op, {"first": firsts.get(op, tracker.PAGE_SIZE)})
             for op in client.operations()}
    assert max(costs.values()) < 10_000, costs
    assert costs["ProjectIssues"] > 25 * 50, "the estimate counts nested connections"
    # The issues page size could not be much larger: it is the budget's bottleneck.
    assert complexity(fake_schema, "ProjectIssues", {"first": 100}) > 10_000
