"""The Linear client's documents, held to Linear's real schema and its cost model.

The real schema (49,840 lines) is parsed once per session. It is not in the
repository: tests find it through ``RALPH_DEV_LINEAR_SCHEMA`` or beside the
clone (``../shared/linear/schema.graphql``) and skip, saying so, without it.
The fake Linear executes that same schema, so "the fake can answer it" is
checked by running every document through the tracker against it.
"""

from __future__ import annotations

import pytest
from fake_linear import MISSING_SCHEMA, Clock, FakeLinear, World, populate_workspace, real_schema
from graphql import GraphQLSchema, parse, validate
from linear_complexity import complexity

from ralph_dev.adapters.tracker.linear import directory as linear_directory
from ralph_dev.adapters.tracker.linear import documents
from ralph_dev.adapters.tracker.linear import reading as pages
from ralph_dev.core.model import NewIssue

BUDGET_PER_QUERY = 5_000
"""ralph-dev's own cap per query (Linear refuses anything over 10,000)."""

PRODUCTION_VARIABLES = {
    "Projects": {"first": linear_directory.PROJECTS_PAGE},
    "Labels": {"first": linear_directory.LABELS_PAGE},
    "ProjectIssues": {"first": pages.PAGE_SIZE},
    "IssuesByIds": {"first": pages.BY_ID_PAGE},
    "RelatedIssues": {"first": pages.RELATED_PAGE},
    "IssueBlockers": {"first": pages.CONNECTION_PAGE},
    "IssueChildren": {"first": pages.CONNECTION_PAGE},
    "ProjectChanges": {"first": pages.POLL_WINDOW, "freshFirst": pages.POLL_FRESH,
                       "commentsFirst": pages.POLL_COMMENTS,
                       "relationsFirst": pages.POLL_RELATIONS},
    "ProjectComments": {"first": pages.POLL_COMMENTS},
}


@pytest.fixture(scope="session")
def schema() -> GraphQLSchema:
    try:
        return real_schema()
    except FileNotFoundError:
        pytest.skip(MISSING_SCHEMA)


def test_operations_are_found() -> None:
    names = documents.operations()
    for expected in ("Viewer", "Projects", "ProjectIssues", "ProjectChanges", "IssueUpdate",
                     "CommentCreate", "IssueCreate", "IssueRelationCreate", "IssueLabelCreate"):
        assert expected in names


@pytest.mark.parametrize("operation", documents.operations())
def test_document_is_one_named_operation_valid_against_real_schema(
    operation: str, schema: GraphQLSchema
) -> None:
    doc = parse(documents.document(operation))
    ops = [d for d in doc.definitions if d.kind == "operation_definition"]
    assert len(ops) == 1
    assert ops[0].name is not None and ops[0].name.value == operation
    errors = validate(schema, doc)
    assert errors == [], [e.message for e in errors]


def test_a_broken_document_is_caught(schema: GraphQLSchema) -> None:
    """The validation above can fail: a misspelt field is reported."""
    errors = validate(schema, parse("query X { viewer { idd } }"))
    assert errors


@pytest.mark.parametrize("operation", documents.operations())
def test_no_query_costs_more_than_5000_points(operation: str, schema: GraphQLSchema) -> None:
    points = complexity(schema, documents.document(operation),
                        PRODUCTION_VARIABLES.get(operation, {}))
    assert points <= BUDGET_PER_QUERY, f"{operation}: {points} points"


def test_the_cost_model_counts_connections_and_page_sizes(schema: GraphQLSchema) -> None:
    one_page = complexity(schema, documents.document("ProjectIssues"), {"first": 1})
    full_page = complexity(schema, documents.document("ProjectIssues"),
                           {"first": pages.PAGE_SIZE})
    assert 40 < one_page < 80, "IssueFields with its nested connections is ~60 points"
    assert full_page > 50 * pages.PAGE_SIZE - 1000
    # the issues page size could not be much larger: the full sync is the bottleneck
    assert complexity(schema, documents.document("ProjectIssues"), {"first": 150}) > 9_000
    # Linear's own examples: 0.1 per field, 1 per object, connections times first
    assert complexity(schema, "query A { viewer { id name } }") == 2
    assert complexity(schema, "query B { issues(first: 10) { nodes { id title } } }") == 13
    # a connection without `first` counts 50 nodes; pageInfo once: 1 + 50 × 1.1 + 1.1
    assert complexity(schema, "query C { issues { nodes { id } pageInfo { hasNextPage } } }"
                      ) == 58


async def test_every_document_is_served_by_the_fake_with_no_error() -> None:
    """Drive the tracker through every operation it has against the fake (which runs the
    real schema and fails loudly on anything it does not implement)."""
    with FakeLinear() as fake:
        ws = populate_workspace(fake, 80)
        world = World(fake, ws.eng, ws.alpha, Clock(), [])
        t = world.tracker(default_team="ENG")
        await t.directory.viewer()
        await t.directory.ensure_labels(["ralph:hold"])
        await t.list_issues()
        fake.update_issue(ws.foreign_blocker, state="Done")
        fake.add_relation(ws.members[-1], ws.members[-2])
        fake.add_comment(ws.members[0], "a person writes")
        world.clock.advance(60)
        await t.list_issues()
        made = await t.create_issues([NewIssue("new", labels=("brand-new",)),
                                      NewIssue("child", parent=ws.members[1],
                                               blocked_by=(ws.members[2],))])
        for member in ws.members[4:12]:  # more changes than a poll brings along
            fake.update_issue(member, title="edited by a person")
        world.clock.advance(60)
        await t.list_issues()
        await t.set_state(made[0], name="In Progress")
        await t.add_labels(made[0], ["ralph:hold"])
        await t.comment(made[0], "hello")
        await t.add_blocker(made[0], ws.members[3])
        assert ws.members[3] not in (await t.remove_blocker(made[0], ws.members[3])).blocked_by
        await t.get(ws.many_relations)
        with pytest.raises(Exception, match="OPS"):
            await t.get("OPS-99999")
        for n in range(60):
            fake.add_comment(ws.members[1], f"flood {n}")
        world.clock.advance(60)
        await t.list_issues()
        errors = [body for body in fake.bodies if '"errors"' in body]
        sent = set(fake.operations())
    assert set(documents.operations()) <= sent, set(documents.operations()) - sent
    assert fake.unimplemented == []
    assert all("Entity not found" in body for body in errors), errors


async def test_the_fake_fails_loudly_on_what_it_does_not_serve() -> None:
    """A field of Linear's schema the fake has no resolver for is an error in the answer
    AND fails the test when the fake stops: never a silent null."""
    import aiohttp

    fake = FakeLinear().start()
    try:
        fake.add_team("ENG")
        async with aiohttp.ClientSession() as session, session.post(
            fake.url, json={"query": "query Q { viewer { id email } }", "operationName": "Q"},
            headers={"Authorization": fake.api_key},
        ) as response:
            body = await response.json()
        assert body["data"] is None
        assert body["errors"][0]["extensions"]["code"] == "FAKE_NOT_IMPLEMENTED"
        assert "User.email" in body["errors"][0]["message"]
    finally:
        with pytest.raises(AssertionError, match=r"User\.email"):
            fake.stop()
