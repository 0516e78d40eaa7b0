"""Domain packs: everything a domain knows, registered by the pack's own app.

The core picks a pack from a scenario version's kind with `pack_for(kind)` and never
imports a pack: a pack registers itself in its AppConfig.ready(), so a deployment
without a pack installed simply has no scenarios of that kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class UnknownDomain(LookupError):
    """No installed pack serves this scenario kind."""


@dataclass(frozen=True)
class ActionTool:
    """An action a pack's agent may propose: what the core's approvals, outbox and policy
    need to know of it. `request(tool_ctx, tool_call)` says what to send (system,
    operation, body) and raises the core's ToolFailure for a request no retry could make
    acceptable; `result(tool_ctx, tool_call, remote)` is the call's response from the
    system's answer, in the transaction that records it; `problems(tool_call)` is the
    pack's own policy, checked again where the action executes (empty: none)."""

    name: str
    risk_floor: str  # the lowest class a definition may give it ("R0".."R3")
    system: str  # the external system that performs it
    request: Callable[[Any, Any], tuple[str, str, dict[str, Any]]]
    result: Callable[[Any, Any, dict[str, Any]], dict[str, Any]]
    problems: Callable[[Any], list[str]] | None = None
    label: Mapping[str, str] = field(default_factory=dict)  # {"zh": ..., "en": ...}
    # Its argument names, in the order a scenario writes them.
    args: tuple[str, ...] = ()
    # The arguments an approver may correct before deciding, and their check against the
    # world: check_args(before, edited) -> the arguments after, or the core's ActionError.
    editable: tuple[str, ...] = ()
    check_args: Callable[[dict[str, Any], dict[str, str]], dict[str, Any]] | None = None
    # The restriction it puts in force on the pack's board: (kind, the argument naming
    # its target); None: it restricts nothing.
    restricts: tuple[str, str] | None = None
    # The action in plain words with its arguments (a lazy "%(arg)s" text): the approval
    # cards and the timeline show a worded action as a decision, not an internal call.
    plain: Any = None
    # What its result says when done, in words (lazy); the core adds where ("... (position
    # 105)") from the registry's argument words.
    done: Any = None
    # The pydantic model of its arguments and what the model reads of it: a pack whose
    # agent lets a model pick calls declares them (the tool list and the call's check).
    schema: Any = None
    description: str = ""
    # An argument's value in the reader's words: (argument name, value, the session's
    # scenario definition or None) -> text. None: values show as written (names, data).
    value_words: Callable[[str, Any, Any], str] | None = None


@dataclass(frozen=True)
class LookupTool:
    """A lookup the agent runs before it reasons (R0, no effect): `run(args)` answers
    from the world the step's job holds (or raises the core's ToolFailure with a logged
    text); its answer lands in the state's enrichment under `key`. `in_process`: it
    reads this database, so it runs in the job's own thread (a remote one gets a thread
    so its timeout holds)."""

    name: str
    run: Callable[[dict[str, Any]], dict[str, Any]]
    key: str
    in_process: bool = True
    schema: Any = None  # as ActionTool.schema
    description: str = ""


@dataclass(frozen=True)
class Reading:
    """How a pack's agent reads the reporter's words, called by the core's providers:
    `offline(definition, text, world, asked)` -> {field: Extraction} from the scenario's
    synonyms alone (the offline provider); `ground(definition, text, world, claims,
    asked)` -> a model's claims, each kept only as far as the words bear it out."""

    offline: Callable[[dict[str, Any], str, Any, str | None], dict[str, Any]]
    ground: Callable[[dict[str, Any], str, Any, Any, str | None], dict[str, Any]]
    # What the extraction call tells the model, per language ("zh", "en").
    instructions: Mapping[str, str] = field(default_factory=dict)
    # An operator's typed correction of a field of one of the pack's own types
    # (spec, raw, world) -> the value as stored; raises the core's ActionError with why
    # the field cannot take it. The core reads enum, bool, number and text itself.
    corrected: Callable[[dict[str, Any], str, Any], Any] | None = None


@dataclass(frozen=True)
class ToolRegistry:
    """A pack's tools, by name. Lookups and analyses are run by the pack's own graph
    nodes through the core's recorded calls; actions are dispatched by the core."""

    actions: Mapping[str, ActionTool] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()  # the names of its evidence tools (R0)
    # Each evidence tool's arguments (a pydantic model, validated when a call runs).
    evidence_args: Mapping[str, Any] = field(default_factory=dict)
    lookups: Mapping[str, LookupTool] = field(default_factory=dict)
    # The agent's own analyses a model may call: name -> (argument model, description).
    analyses: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    # Why a lookup failed, by code (lazy texts with %(...)s): logged in English, read back
    # and worded per reader.
    failures: Mapping[str, Any] = field(default_factory=dict)
    # Its tools' argument names in words (lazy texts): cards, forms and results label
    # arguments with them.
    argument_words: Mapping[str, Any] = field(default_factory=dict)
    # The arguments that say what a call acts on, in the order the timeline names them
    # ("close_taxiway (A)"): two decisions on one tool are told apart by them.
    target_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class HistoryFilter:
    """A fact a pack's sessions are found by in history (an IT diagnosis's problem type
    and root-cause service, the apron's flight and position): where the snapshot holds
    it (its keys, outermost first), the filter's label, and its choices as (value, label)
    pairs, read when a form is made (the labels in the reader's language). Without
    choices the value is typed: at most `max_length` characters, as `pattern` allows (the
    API's check), kept as `clean` makes it."""

    name: str
    path: tuple[str, ...]
    label: Any
    choices: Callable[[], list[tuple[str, Any]]] | None = None
    max_length: int = 64
    pattern: str = ""
    clean: Callable[[str], str] = str.strip
    # Shown as a column of its own (the history page's rows, a field of the API's rows),
    # not among the facts under the scenario's name.
    column: bool = False


@dataclass
class DomainPack:
    """One domain's parts. The fields grow as parts move out of the core; each is
    optional only while its move is under way."""

    kind: str  # the scenario kind this pack serves, e.g. "apron"
    app_label: str
    label: dict[str, str]  # the domain's name per language, {"zh": ..., "en": ...}
    definition_model: Any = None  # pydantic model of a scenario definition of this kind
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    # The session's LangGraph graph, uncompiled: the core compiles it once per process
    # with its checkpointer and runs it in its jobs.
    graph: Callable[[], Any] | None = None
    # The graph's first input for a new session: (session, definition) -> state.
    initial_state: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    # The world the agent acts on (AgentContext.graph), from the stamp the lease read.
    world: Callable[[Any], Any] | None = None
    # The model whose one active row (is_active) stamps the world: a job's lease reads its
    # (id, updated_at), so the job builds the world again only when it changed. None: a
    # world that never changes.
    world_stamp: Any = None
    # Loads the world's built-in data (load_builtin), before any scenario is published:
    # publishing runs a scenario's example cases against it. Returns what it did.
    seed_world: Callable[[], list[str]] | None = None
    # What the admin's changes to the world's models are audited as: model label
    # ("app.model") -> (created, changed, deleted) actions.
    admin_actions: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    # How its agent reads the reporter's words (the providers' extraction); None: it
    # reads none.
    reading: Reading | None = None
    # What a ReAct step tells the model to do with the tools, per language.
    react_prompt: Mapping[str, str] = field(default_factory=dict)
    # Whether a session of this kind starts from the reporter's message alone (the
    # message form, the CLI's --message, a model extracting the opening message).
    opens_from_message: bool = True
    # Seeds the pack's built-in data (load_builtin; `update`: publish changed files);
    # returns what it did, line by line.
    seed: Callable[[bool], list[str]] | None = None
    # Opens a session from an evidence file (a diagnosis's incident bundle):
    # (user, path, options) -> the session, queued; nothing created for a bad file.
    start_from_file: Callable[[Any, Any, dict[str, Any]], Any] | None = None
    # A session's result as the command line prints it (`incident run --json`).
    summarize: Callable[[Any], dict[str, Any]] | None = None
    # A session's report fields (the API's `report`): (session) -> dict. None: no such
    # fields (the report is the Markdown only).
    report_fields: Callable[[Any], dict[str, Any]] | None = None
    # The Markdown export (replay): the pack's own template (it may extend the core's
    # replay/export.md and replace its blocks) and what it adds to the template's context:
    # (session, mask or None) -> dict. None: the core's export.
    export_template: str | None = None
    export_context: Callable[[Any, Any], dict[str, Any]] | None = None
    # The session page's panel of what the agent found (a template name), and what it
    # adds to the page's context: (session, the viewer's mask or None) -> dict, masked as
    # the page masks the snapshot. None: the core's facts panel.
    page_panel: str | None = None
    page_context: Callable[[Any, Any], dict[str, Any]] | None = None
    # What its analyses found, drawn under the core's facts panel's known fields (a
    # template name; the apron's lookups, risk, impact and map), on the session page and
    # on a replay step; the context is the page's. None: nothing beyond the fields.
    facts_template: str | None = None
    replay_facts_template: str | None = None
    # The same on an incident's card in the approval queue (a template name; the apron's
    # risk line with its impact, and the lookups' warning); the context is the card's
    # (`group`). None: the card shows its actions only.
    card_template: str | None = None
    # The same panel on a replay step, from the log folded to that step:
    # (session, folded state, mask or None) -> dict. None: replay shows the core's facts.
    replay_context: Callable[[Any, Any, Any], dict[str, Any]] | None = None
    # What the session pages word every session with, read once for many of them:
    # (the world's stamp as read, or None: as it is now; the restrictions in force) -> a
    # diagnosis.presenters.PageWorld (its board: what an action would do; its map of a
    # session's impact). Raises LookupError where the pack's world is not loaded.
    page_world: Callable[[Any, list[Any]], Any] | None = None
    # The model of the restrictions its actions put in force (a closure, a suspension),
    # lifted through the core's lift: rows with kind (choices, labelled), target, session,
    # tool_call, created_at, lifted_at, lifted_by and lift_note. None: it restricts nothing.
    restrictions: Any = None
    # A warning read from a session's enrichment (what its lookups found disagrees),
    # in the reader's language; "" when there is none.
    enrichment_warning: Callable[[Any], str] | None = None
    # Its own pages: their URLconf (a module name, included at the site's root) and the
    # links the top bar shows to them, as (label, URL name).
    urls: str | None = None
    nav: tuple[tuple[Any, str], ...] = ()
    # Where the pack's own form to open a session is (a URL name), if it has one.
    new_session_url: str | None = None
    # A session was soft-deleted: drop what the pack keeps outside the log for it.
    on_deleted: Callable[[Any], None] | None = None
    # The example cases of a definition, run through the pack's own analysis (`scenario
    # check`): each has number, passed, problems and summary(). A pack with its own has
    # no row-edited draft: its published versions are what is checked.
    check_examples: Callable[[dict[str, Any]], list[Any]] | None = None
    # The example cases of a row-edited definition (a draft or a version) run through the
    # pack's agent without a model (publish's self-check, `scenario check`): each has
    # number, text, passed, problems and summary(); LookupError when its world is missing.
    check_draft: Callable[[dict[str, Any]], list[Any]] | None = None
    # What history filters this pack's sessions by, besides the core's own filters.
    history_filters: tuple[HistoryFilter, ...] = ()
    # The pack's own /api/v1 operations: () -> a django-ninja Router, mounted at the
    # API's root once (the core's auth, problems and paging are the router's to import).
    api_router: Callable[[], Any] | None = None
    # How the Django admin edits a scenario of this kind: "rows" (the draft's row editor,
    # made for the apron's fields, rules and actions) or "yaml" (the whole definition as
    # one YAML document, checked by `definition_model`): a definition with parts of its
    # own, such as the diagnosis playbook, has no rows to be edited as.
    admin_editor: str = "rows"
    # With admin_editor "rows": the draft's rows of its own, beyond the core's fields and
    # values (scenarios_admin.draft), by part name in the order they are written, each
    # (model with a `scenario` foreign key, its columns as the draft reads them) ...
    draft_rows: Mapping[str, tuple[Any, tuple[str, ...]]] = field(default_factory=dict)
    # ... how they are read as the definition's parts of its own: (draft, the fields as
    # the core read them, the issues to add to) -> {definition key: value}; and back:
    # (definition) -> (the scenario's columns of its own, {part: rows}) ...
    draft_definition: Callable[[Any, dict[str, Any], list[Any]], dict[str, Any]] | None = None
    definition_draft: (
        Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, list[Any]]]] | None
    ) = None
    # ... where the row editor marks a problem of one of them: (issue, the scenario form,
    # the page's live row forms by part) -> the summary's line, or None: not one of its.
    place_draft_issue: Callable[[Any, Any, Mapping[str, list[Any]]], str | None] | None = None
    # ... how its YAML file orders them: (definition) -> {its own key: the value with every
    # mapping in canonical order}; None: by its definition model's field order ...
    canonical_parts: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # ... and the scenario admin's inlines that edit them, in page order (the core's
    # field and value inlines among them where the pack wants them).
    row_inlines: tuple[Any, ...] = ()
    # ... and the help above them on writing its conditions, lists and arguments, with
    # its own examples (a template name). None: no help.
    row_help_template: str | None = None
    # Its models the core held before (their admin pages moved with their app label):
    # old "app_label.model" -> new "app_label.model"; the old pages redirect to the new.
    moved_admin: Mapping[str, str] = field(default_factory=dict)
    # With admin_editor "yaml": () -> the definition a new scenario of this kind starts
    # from on the admin's add page (the shipped one; the page gives it a free slug and a
    # new name). None: the kind cannot be added there (import a file instead).
    starting_definition: Callable[[], dict[str, Any]] | None = None


_PACKS: dict[str, DomainPack] = {}


_ACTIONS: dict[str, tuple[str, ActionTool]] = {}  # tool name -> (pack kind, tool)


def register(pack: DomainPack) -> None:
    """Called once per pack from its AppConfig.ready(); a second kind holder is a bug, and
    so is an action name two packs declare (the core dispatches an action by its name)."""
    holder = _PACKS.get(pack.kind)
    if holder is not None and holder.app_label != pack.app_label:
        raise RuntimeError(f"scenario kind {pack.kind!r} is served by {holder.app_label} already")
    for name, tool in pack.tools.actions.items():
        owner = _ACTIONS.get(name)
        if owner is not None and owner[0] != pack.kind:
            raise RuntimeError(f"action {name!r} is declared by the {owner[0]} pack already")
        _ACTIONS[name] = (pack.kind, tool)
    _PACKS[pack.kind] = pack


def action_tool(name: str) -> ActionTool | None:
    """The action declared under `name` by an installed pack, or None."""
    found = _ACTIONS.get(name)
    return found[1] if found else None


def actions_of(kind: str) -> Mapping[str, ActionTool]:
    """The actions of the pack serving `kind`; none when no installed pack serves it."""
    pack = _PACKS.get(kind)
    return pack.tools.actions if pack is not None else {}


def action_args(name: str) -> tuple[str, ...]:
    """The argument names of the action `name` (none for an unknown one)."""
    declared = action_tool(name)
    return declared.args if declared is not None else ()


def restricting_action(kind: str) -> ActionTool | None:
    """The action that puts a restriction of `kind` in force: its system also lifts it."""
    for _kind, tool in _ACTIONS.values():
        if tool.restricts is not None and tool.restricts[0] == kind:
            return tool
    return None


def argument_words() -> dict[str, Any]:
    """Every installed pack's argument words (the first pack's word for a shared name)."""
    words: dict[str, Any] = {}
    for pack in _PACKS.values():
        for name, word in pack.tools.argument_words.items():
            words.setdefault(name, word)
    return words


def target_args() -> tuple[str, ...]:
    """Every installed pack's target arguments, in pack order, each once."""
    return tuple(dict.fromkeys(a for pack in _PACKS.values() for a in pack.tools.target_args))


def file_pack() -> DomainPack:
    """The installed pack that opens sessions from an evidence file."""
    for pack in _PACKS.values():
        if pack.start_from_file is not None:
            return pack
    raise UnknownDomain("no installed domain pack opens sessions from a file")


def default_kind() -> str:
    """The first installed pack's kind (INSTALLED_APPS order): what the core uses where no
    session is at hand (a worker warming up, the checkpointer shared by every kind)."""
    if not _PACKS:
        raise UnknownDomain("no domain pack is installed")
    return next(iter(_PACKS))


def restriction_model() -> Any:
    """The model of the restrictions in force (the first installed pack that keeps them),
    or None."""
    return next((p.restrictions for p in _PACKS.values() if p.restrictions is not None), None)


def active_world(stamp: tuple[Any, Any] | None = None) -> Any:
    """The active world of the pack whose world is stamped, built once per process and
    stamp by that pack; `stamp` as a job's lease read it. LookupError when none is."""
    pack = stamped_pack()
    if pack is None or pack.world is None:
        raise LookupError("no installed domain pack keeps a world to act on")
    return pack.world(stamp)


def stamped_pack() -> DomainPack | None:
    """The installed pack whose world is read from the database under a stamp (the first
    in INSTALLED_APPS order), or None."""
    return next((p for p in _PACKS.values() if p.world_stamp is not None), None)


def pack_for(kind: str) -> DomainPack:
    try:
        return _PACKS[kind]
    except KeyError:
        raise UnknownDomain(f"no installed domain pack serves scenario kind {kind!r}") from None


def edited_as_yaml(kind: str) -> bool:
    """Whether the admin edits a scenario of `kind` as one YAML document (an unknown kind
    keeps the row editor, as before packs could choose)."""
    pack = _PACKS.get(kind)
    return pack is not None and pack.admin_editor == "yaml"


def draft_rows(kind: str) -> Mapping[str, tuple[Any, tuple[str, ...]]]:
    """The draft rows of its own the pack serving `kind` edits (none for an unknown kind
    or one edited as YAML)."""
    pack = _PACKS.get(kind)
    return pack.draft_rows if pack is not None and pack.admin_editor == "rows" else {}


def row_pack(kind: str) -> DomainPack | None:
    """The pack serving `kind` if the admin edits its scenarios as rows, else None."""
    pack = _PACKS.get(kind)
    return pack if pack is not None and pack.admin_editor == "rows" else None


def row_edited() -> list[DomainPack]:
    """The packs whose scenarios the admin edits as rows with inlines of their own."""
    return [p for p in _PACKS.values() if p.admin_editor == "rows" and p.row_inlines]


def added_as_yaml() -> list[DomainPack]:
    """The packs whose scenarios the admin's add page writes as one YAML document."""
    return [p for p in _PACKS.values() if edited_as_yaml(p.kind) and p.starting_definition]


def installed_packs() -> list[DomainPack]:
    return list(_PACKS.values())


def admin_actions() -> dict[str, tuple[str, str, str]]:
    """Every installed pack's audited admin actions by model label."""
    return {label: names for p in _PACKS.values() for label, names in p.admin_actions.items()}


def moved_admin() -> dict[str, str]:
    """Every installed pack's models moved from the core: old label -> new label."""
    return {old: new for p in _PACKS.values() for old, new in p.moved_admin.items()}


def history_filters() -> dict[str, HistoryFilter]:
    """Every installed pack's history filters by name (the first pack's, if two name one)."""
    found: dict[str, HistoryFilter] = {}
    for pack in _PACKS.values():
        for item in pack.history_filters:
            found.setdefault(item.name, item)
    return found
