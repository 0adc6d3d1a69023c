"""Which turn endings are questions for a person (``core.questions``), over a corpus.

Each message is written the way Claude Code's final message of a turn looks (the Stop
hook's ``last_assistant_message``): Markdown, lists, code fences, tables. A question
missed costs the issue its attempts and never reaches anyone; a statement taken for a
question holds a finished issue for a person with nothing to decide. The corpus checks
both, and a rule change that trades one for the other shows here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from ralph_dev.core.questions import QUESTION_CHARS, asked_question, last_message, tool_question


@dataclass(frozen=True)
class Ending:
    name: str
    message: str
    asks: str | None
    """A sentence the posted question must hold; None: not a question."""


QUESTIONS = [
    Ending("trailing question after a look around",
           "I read the code.\n\nShould I use Postgres or SQLite?",
           "Should I use Postgres or SQLite?"),
    Ending("bold question alone", "**Which of the two APIs do you want?**",
           "Which of the two APIs do you want?"),
    Ending("question then please reply (the issue 24 example)",
           "Before I go on I need a decision: should the storage format be JSON or SQLite? "
           "Please reply and I will continue.",
           "should the storage format be JSON or SQLite?"),
    Ending("question then let me know",
           "The issue says the export should be \"fast\" but gives no target.\n\n"
           "What latency should I aim for on a 10k-row export? Let me know.",
           "What latency should I aim for"),
    Ending("question then I'll continue once you answer",
           "I found two config loaders: `load_toml()` in `config.py` and `read_settings()` in "
           "`legacy/settings.py`. They disagree on defaults.\n\n"
           "Which one is the source of truth? I'll continue once you answer.",
           "Which one is the source of truth?"),
    Ending("question then waiting for your answer",
           "The migration would drop the `legacy_id` column, which the reporting job still "
           "reads.\n\nIs it safe to drop it now?\n\nWaiting for your answer before I touch "
           "the schema.",
           "Is it safe to drop it now?"),
    Ending("numbered options then which do you prefer",
           "There are two ways to fix the race:\n\n"
           "1. **A lock around `save()`**: small change, but serializes every write.\n"
           "2. **Append-only log**: no lock, but a bigger refactor of `store.py`.\n\n"
           "Which do you prefer?",
           "Which do you prefer?"),
    Ending("bulleted options then let me know which approach without question mark",
           "I can solve the timezone bug in one of two ways:\n\n"
           "- Store everything in UTC and convert on display\n"
           "- Keep local times and store the zone next to each timestamp\n\n"
           "Let me know which approach you'd like.",
           "Let me know which approach you'd like."),
    Ending("option A or B",
           "There are two ways to proceed:\n\n"
           "**Option A**: keep the old API and add a deprecation warning.\n"
           "**Option B**: remove it now and bump the major version.\n\n"
           "Option A or B?",
           "Option A or B?"),
    Ending("should I ... or ... without question mark",
           "The `--format` flag is undocumented and nothing in the repo uses it.\n\n"
           "Should I keep it for backwards compatibility or remove it",
           "Should I keep it for backwards compatibility or remove it"),
    Ending("decision request without question mark",
           "Both designs pass the existing tests. I need you to decide between storing "
           "sessions in Redis and keeping them in process memory.",
           "I need you to decide between"),
    Ending("question with a recommendation after it",
           "The `retry` decorator is used in 14 places with different semantics.\n\n"
           "Should I unify them into one policy, or leave each call site as it is? "
           "I'd recommend unifying, since two of them retry non-idempotent requests.",
           "Should I unify them into one policy"),
    Ending("options after the question",
           "I need a decision before I continue. Which storage backend should I use?\n\n"
           "1. SQLite — one file, no server\n"
           "2. Postgres — what production already runs\n\n"
           "Either works with the current code.",
           "Which storage backend should I use?"),
    Ending("list of open questions",
           "I need clarification on the requirements before proceeding:\n\n"
           "1. Should deleted items be soft-deleted or hard-deleted?\n"
           "2. Should the API return 404 or 410 for a deleted item?\n\n"
           "Once you answer these, I'll implement the changes.",
           "Should the API return 404 or 410"),
    Ending("missing input, please provide",
           "The tests need `config/test.yaml`, which is not in the repository and the issue "
           "does not say what it holds. I can't go on without it.\n\n"
           "Please provide the file, or tell me which values it should contain.",
           "Please provide the file"),
    Ending("please confirm which rule applies",
           "The spec contradicts itself on rounding: section 2 says banker's rounding, "
           "section 5 says round half up. Please confirm which rule applies.",
           "Please confirm which rule applies."),
    Ending("question in a heading-led section",
           "## Progress\n\n- Parsed the input format\n- Wrote tests for the parser\n\n"
           "## Question\n\nThe issue asks for \"CSV export\" but the sample file uses "
           "semicolons. Should the exporter use commas or semicolons as the separator?",
           "Should the exporter use commas or semicolons"),
    Ending("yes/no go-ahead before any work",
           "Fixing this properly means changing the public signature of `Client.fetch()`, "
           "which three other packages call.\n\nIs it OK to change the signature?",
           "Is it OK to change the signature?"),
    Ending("blocked until someone decides",
           "I'm blocked until someone decides whether the v1 endpoints must keep working "
           "after this change.",
           "decides whether the v1 endpoints"),
    Ending("could you clarify with a question mark and thanks",
           "The acceptance criteria mention a \"compact mode\" that I can't find anywhere "
           "in the code or docs. Could you clarify what compact mode should do?\n\nThanks!",
           "Could you clarify what compact mode should do?"),
    Ending("a table of options then which one",
           "Here is how the two libraries compare:\n\n"
           "| Library | Size | Maintained |\n|---|---|---|\n| `ujson` | 200 KB | yes |\n"
           "| `orjson` | 1 MB | yes |\n\nWhich one should I add as a dependency?",
           "Which one should I add as a dependency?"),
    Ending("code options then which signature",
           "Two possible signatures:\n\n```python\ndef export(rows, *, path=None) -> str: ...\n"
           "```\n\n```python\ndef export(rows, stream: IO[str]) -> None: ...\n```\n\n"
           "Which signature do you want?",
           "Which signature do you want?"),
    Ending("question after a partly finished summary",
           "I've implemented the parser and all tests pass.\n\nBefore I write the exporter I "
           "need a decision: should the output be JSON Lines or one JSON array?",
           "should the output be JSON Lines or one JSON array?"),
    Ending("which approach do you prefer without question mark after options",
           "I see three options:\n\n- (a) vendor the library\n- (b) pin it to 2.x\n"
           "- (c) drop the feature that needs it\n\nWhich approach do you prefer.",
           "Which approach do you prefer."),
    Ending("please choose one of the options above",
           "The build can target either Python 3.10 (what CI runs) or 3.12 (what the "
           "Dockerfile uses).\n\nPlease choose one; I haven't changed anything yet.",
           "Please choose one"),
    Ending("numbered open questions, answers awaited",
           "I've got two questions before I go further:\n\n"
           "1. **Auth**: should `/export` require an API token, like `/import` does?\n"
           "2. **Pagination**: cursor-based or offset-based?\n\n"
           "Once I have your answers I'll implement it.",
           "cursor-based or offset-based?"),
    Ending("how would you like me to proceed",
           "The stack trace points at `vendor/legacy_xml.py`, which the issue says must not "
           "be modified. Fixing the crash there is a two-line change; working around it in "
           "our code is about 80 lines.\n\nHow would you like me to proceed?",
           "How would you like me to proceed?"),
    Ending("go-ahead for an option before any change",
           "I haven't made any changes yet. Would you like me to proceed with option 2 "
           "(the adapter)?",
           "Would you like me to proceed with option 2"),
    Ending("options under a heading, bold question, waiting",
           "### Options\n\n- **A. Keep `v1` routes**, mark them deprecated\n"
           "- **B. Drop `v1`** and bump the major version\n\n"
           "**Which would you prefer?** I'll wait for your decision before making changes.",
           "Which would you prefer?"),
    Ending("one sentence with a dash and two outcomes",
           "What should happen when the input file is empty — exit with an error, or write "
           "an empty report?",
           "What should happen when the input file is empty"),
    Ending("I need your input, then the question",
           "I need your input on one thing: the issue says \"retry on failure\" but not how "
           "many times. Should I use 3 retries with exponential backoff, or make it "
           "configurable?",
           "Should I use 3 retries"),
    Ending("want me to go with A or B, then a note on both",
           "Want me to go with the Redis cache or the in-memory LRU? Both are sketched in "
           "`notes/cache.md`.",
           "Want me to go with the Redis cache or the in-memory LRU?"),
    Ending("could you provide, I'll pick it up from there",
           "I'm unable to continue without access to the staging database. Could you provide "
           "the connection string (or a dump of the `orders` table)? I'll pick it up from "
           "there.",
           "Could you provide the connection string"),
    Ending("announced quick question with context after it",
           "Quick question before I start: is Python 3.9 still supported? The issue uses "
           "`match` statements, which need 3.10.",
           "is Python 3.9 still supported?"),
    Ending("let me know whether, and I'll finish",
           "Let me know whether the new flag should be on or off by default, and I'll finish "
           "the docs.",
           "Let me know whether the new flag should be on or off by default"),
    Ending("tests already failing on main: fix or leave",
           "Two tests fail on main before my change (`test_a`, `test_b`). Should I fix them "
           "as part of this issue or leave them?",
           "Should I fix them as part of this issue or leave them?"),
    Ending("a format to choose, the choice without a verb",
           "I need to know the expected date format. ISO 8601 or the US format?",
           "ISO 8601 or the US format?"),
]

STATEMENTS = [
    Ending("done", "Done: all tests pass.", None),
    Ending("self-answered question", "Is it X? I checked: it is. All tests pass.", None),
    Ending("rhetorical question inside a done",
           "Done. Why did it fail? The cache was stale. Fixed and all tests pass.", None),
    Ending("summary of finished work",
           "## Summary\n\nI fixed the race condition in `worker.py` by holding a lock "
           "around the state update.\n\n- Added `threading.Lock` to `StateStore`\n"
           "- Added a regression test that runs two writers at once\n\n"
           "All 48 tests pass.", None),
    Ending("courtesy offer at the end of a summary",
           "I've added the `--dry-run` flag to `deploy`. It prints the plan and exits "
           "before touching anything; covered by two new tests.\n\n"
           "Let me know if you want anything else.", None),
    Ending("offer of more work as a question",
           "I've implemented the retry logic with exponential backoff. All 23 tests pass."
           "\n\nWould you like me to also add jitter to the backoff?", None),
    Ending("check-in after finished work",
           "The importer now skips blank lines and reports the line number of a bad row. "
           "I've added tests for both cases and they pass.\n\nDoes this look good to you?",
           None),
    Ending("anything else",
           "Fixed: the CLI now exits 2 on a bad config instead of printing a traceback."
           "\n\nAnything else you'd like me to look at?", None),
    Ending("fenced code with regex and ternary",
           "The bug was in the pattern. It is now:\n\n```python\n"
           "PATTERN = re.compile(r\"^(\\w+)?=(.*)?$\")\nvalue = x if ok else None  # ok?\n"
           "url = f\"{base}/items?page={n}\"\n```\n\nThe tests cover empty keys now.", None),
    Ending("fenced code block at the very end",
           "I've updated the example in the README:\n\n```js\n"
           "const v = ready ? load() : null;\nfetch(`/api/search?q=${q}`);\n```", None),
    Ending("indented code with a question mark",
           "The config now accepts optional keys:\n\n"
           "    timeout = 30?\n    retries = maybe?\n\nBoth are parsed with defaults.", None),
    Ending("inline code with question marks",
           "Implemented `GET /items?page=N` and made `parse()` handle `a ? b : c`.", None),
    Ending("url with a query string",
           "The API docs are at https://example.com/api/search?q=term&page=2 and the "
           "client now follows them.", None),
    Ending("markdown table with question marks",
           "Done. Endpoints checked:\n\n| Endpoint | Status |\n|---|---|\n"
           "| `/search?q=` | fixed? yes |\n| /items?page= | unchanged |", None),
    Ending("a question quoted, then answered",
           "The issue asks:\n\n> Should the parser accept tabs?\n\n"
           "Yes: the spec says tabs are whitespace, so the parser now accepts them and "
           "there is a test for it.", None),
    Ending("answered its own design question",
           "Is the lock needed? Yes: two workers can write the same file at once. I added "
           "it along with a test that fails without it.", None),
    Ending("what's next, nothing",
           "I've run the migration on the test database. What's next? Nothing: the issue "
           "is complete.", None),
    Ending("plan for the next step, stated",
           "The parser is in place. Next I'll write the exporter and its tests.", None),
    Ending("conditional should you",
           "Added `make migrate`. Should you need to re-run the migration, use "
           "`make migrate FORCE=1`.", None),
    Ending("let me know if you'd prefer the other way",
           "I went with JSON for the storage format since nothing needs queries yet; it is "
           "behind `Store`, so switching later is one class.\n\nLet me know if you'd "
           "prefer SQLite instead.", None),
    Ending("summary ending in a bullet list",
           "Changes:\n\n- Renamed `cfg` to `config` everywhere\n"
           "- Removed the unused `legacy_loader` module\n- Updated the docs", None),
    Ending("finished with a parenthetical question",
           "Fixed the flaky test (why was it flaky? two tests shared a tmp dir). All "
           "tests pass.", None),
    Ending("issue title quoted in a statement",
           "Closed the \"Why is startup slow?\" investigation: the cause was the plugin "
           "scan, now cached.", None),
    Ending("feel free",
           "All done: the README now documents the new flags. Feel free to ask if "
           "anything is unclear.", None),
    Ending("shall I commit, after finished work",
           "I've finished the refactor and the test suite is green.\n\nShall I commit "
           "this?", None),
    Ending("want me to open a follow-up",
           "Fixed the crash on empty input. The same pattern exists in `export.py`; want "
           "me to fix that too?", None),
    Ending("decided between options itself",
           "I had to decide between a lock and a queue; I went with the queue because it "
           "keeps writes ordered. All tests pass.", None),
    Ending("which approach I took", "Which approach I took: the second one, because it "
           "keeps the public API unchanged.", None),
    Ending("hope this helps", "The flag is documented now. Hope this helps!", None),
    Ending("Claude's closing summary with headings",
           "I've completed the task. Here's a summary of the changes:\n\n### Files changed\n"
           "- `src/export.py`: added `write_csv()`\n- `tests/test_export.py`: 4 new tests\n\n"
           "### Testing\n- `pytest` — 112 passed\n\nThe implementation is ready for review.",
           None),
    Ending("all done after worker done",
           "All done! `ralph-dev worker done DEMO-4` succeeded and the issue is reported "
           "finished.", None),
    Ending("any other changes, after finished work",
           "I've updated the parser and all tests pass. Would you like me to make any other "
           "changes?", None),
    Ending("should I also, after green tests",
           "The tests are green. Should I also update the CHANGELOG?", None),
    Ending("Done then a code comment asking why",
           "Done.\n\n```python\n# why not asyncio? the client library is sync-only\n"
           "result = client.fetch(url)\n```", None),
    Ending("rhetorical why-not answered in a note",
           "Note: why not use asyncio here? Because the client library is sync-only, so "
           "threads are simpler. The change is in `fetch.py`.", None),
    Ending("ready for review, any questions",
           "Ready for review. Let me know if you have any questions!", None),
    Ending("blocked already reported with the command",
           "I've reported the issue as blocked with `ralph-dev worker blocked` and I'm "
           "waiting for an answer.", None),
    Ending("table summary with a check mark",
           "**Summary**\n\n| File | Change |\n|---|---|\n| `a.py` | fix |\n\n"
           "Everything passes \u2705", None),
    Ending("what do you think, after finished work",
           "I've added retry logic to the client and all tests pass. What do you think?", None),
    Ending("want me to open a PR, after green tests", "Tests pass. Want me to open a PR?", None),
    Ending("optional next steps as a list",
           "Everything is implemented as requested.\n\n**Next steps** (optional):\n"
           "- Add caching\n- Add metrics", None),
    Ending("empty", "", None),
    Ending("only whitespace", "  \n\n ", None),
]

CORPUS = QUESTIONS + STATEMENTS


def test_the_corpus_is_big_enough_to_mean_something() -> None:
    assert len(CORPUS) >= 40 and len(QUESTIONS) >= 20 and len(STATEMENTS) >= 20


@pytest.mark.parametrize("ending", QUESTIONS, ids=lambda e: e.name)
def test_no_question_is_missed(ending: Ending) -> None:
    found = asked_question(ending.message)
    assert found is not None, f"missed: {ending.message!r}"
    assert ending.asks is not None and ending.asks in found, found


def test_at_most_one_statement_over_the_corpus_is_taken_for_a_question() -> None:
    offenders = [(e.name, asked_question(e.message)) for e in STATEMENTS
                 if asked_question(e.message) is not None]
    assert len(offenders) <= 1, "taken for questions:\n" + "\n".join(
        f"- {name}: {found!r}" for name, found in offenders)


@pytest.mark.parametrize("value", [None, 42, ["Should I?"], {"text": "Which one?"}, b"Why?"])
def test_anything_but_text_is_no_question(value: object) -> None:
    assert asked_question(value) is None


def test_the_posted_question_is_the_asking_part_not_the_whole_turn() -> None:
    """A long report of work before the question stays out of the comment; the options
    and what leads into them stay in."""
    message = ("## What I did\n\n" + "I read every module and traced the call paths. " * 20
               + "\n\nThe exporter can write two formats:\n\n- CSV\n- Parquet\n\n"
               "Which format should be the default?")
    found = asked_question(message)
    assert found is not None
    assert found.startswith("The exporter can write two formats:")
    assert "- CSV\n- Parquet" in found and found.endswith("Which format should be the default?")
    assert "traced the call paths" not in found


def test_a_long_question_is_cut_from_the_front_and_keeps_its_end() -> None:
    message = "Context: " + "x" * 5000 + "\n\nShould I keep the cache?"
    found = asked_question(message)
    assert found is not None and len(found) <= QUESTION_CHARS
    assert found.startswith("…") and found.endswith("Should I keep the cache?")


def test_control_characters_are_cleaned_from_the_question() -> None:
    found = asked_question("\x1b[1mShould I\x1b[0m use \x07tabs or spaces?")
    assert found == "Should I use tabs or spaces?"


def test_ask_user_question_input_reads_as_a_comment() -> None:
    """Claude Code 2.1's AskUserQuestion input: questions, each with its options."""
    found = tool_question({"questions": [
        {"question": "Which formats?", "header": "Formats", "multiSelect": True,
         "options": [{"label": "CSV", "description": "plain"}, {"label": "JSON"}]},
        {"question": "Keep the\nold\x1b[2J flag?", "options": "not a list"},
        {"header": "no question"}, "junk"]})
    assert found == ("**Formats**: Which formats?\n(one or more of:)\n- CSV — plain\n- JSON\n\n"
                     "Keep the old flag?")
    for nothing in (None, {}, {"questions": "x"}, {"questions": [{"question": 3}]}):
        assert tool_question(nothing) is None


def test_the_last_message_of_a_transcript_is_its_last_text_unless_a_tool_call_follows() -> None:
    def line(*blocks: dict[str, object], role: str = "assistant") -> str:
        return json.dumps({"type": role, "message": {"role": role, "content": list(blocks)}})

    text = {"type": "text", "text": "Which one?"}
    call = {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}
    deep = '{"message": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert last_message([line(call), line(text), "not json", deep,
                         line({"type": "thinking", "thinking": "hm"})]) == "Which one?"
    assert last_message([line(text), line(call)]) is None
    assert last_message([line(text), line({"type": "tool_result"}, role="user")]) == "Which one?"
    assert last_message([]) is None
