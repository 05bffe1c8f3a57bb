"""make e2e: a person uses agora's page in a real headless Chromium.

Drives Debian's Chromium with Playwright (from the interop virtual environment):
a bad token, signing in, posting, another agent's post arriving without a
reload (a hostile one, which must show as text and never run), a reply, direct
mail, claiming a task, notes, the team (who holds and reserves what) and the
plan (a graph of the unfinished tasks, checked as a layered graph whose arrows never
pass under a box, at laptop and phone sizes); a person told on ntfy of a decision,
answering it on a phone; screenshots of the page, the team, the plan, Needs you and a
decision at laptop and phone sizes land in .interop/. Loopback only; ends with
'N passed, N failed'.
"""

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGORA, ROOT, check, mint_token, rest, start_server,  # noqa: E402
                     stop_server, summary)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = os.path.join(ROOT, ".interop")
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\"> bot says hi"
FITS = ("document.documentElement.scrollWidth <= window.innerWidth && "
        "document.querySelector('#plan-wrap').scrollWidth <= "
        "document.querySelector('#plan-wrap').clientWidth")
# Where the plan's arrows pass through a box other than their two ends: each arrow's path
# sampled every 2 px against every other box, less a pixel at its border.
CROSSINGS = """[...document.querySelectorAll('#plan path.arrow')].flatMap((arrow) => {
  const boxes = [...document.querySelectorAll('#plan g.node')].filter((g) =>
    g.dataset.id !== arrow.dataset.from && g.dataset.id !== arrow.dataset.to);
  const hit = new Set(), length = arrow.getTotalLength();
  for (let along = 0; along <= length; along += 2) {
    const p = arrow.getPointAtLength(along);
    for (const g of boxes) {
      const r = g.querySelector('rect').getBBox();
      if (p.x > r.x + 1 && p.x < r.x + r.width - 1 && p.y > r.y + 1 && p.y < r.y + r.height - 1)
        hit.add(arrow.dataset.from + ' -> ' + arrow.dataset.to + ' under ' + g.dataset.id);
    }
  }
  return [...hit];
})"""
# Each box's top and each arrow's two ends, for checking the layers from outside.
DRAWN = ("[Object.fromEntries([...document.querySelectorAll('#plan g.node')].map((g) => "
         "[g.dataset.id, +g.querySelector('rect').getAttribute('y')]))," +
         "[...document.querySelectorAll('#plan path.arrow')].map((a) => "
         "[a.dataset.from, a.dataset.to])]")
HOSTILE_TITLE = "<script>window.pwned=3</script>hostile title"
HOSTILE_REASON = "<img src=x onerror=\"window.pwned=4\">hostile reason"

# A plan as people write them: a design, parts built side by side, their tests, then
# what joins them up; each entry is (title, the titles it waits for).
PLAN = [("design the release", []),
        ("write the api", ["design the release"]), ("write the store", ["design the release"]),
        ("write the page", ["design the release"]), ("write the cli", ["design the release"]),
        ("test the api", ["write the api"]), ("test the store", ["write the store"]),
        ("test the page", ["write the page"]), ("test the cli", ["write the cli"]),
        ("migrate old files", ["write the store"]), ("profile the store", ["test the store"]),
        ("browser check", ["test the page"]), ("docs for the api", ["write the api"]),
        ("docs for the cli", ["write the cli"]), ("security review", ["test the api",
                                                                      "test the page"]),
        ("integrate", ["test the api", "test the store", "test the page", "test the cli"]),
        ("load test", ["integrate", "profile the store"]), ("release notes", ["integrate"]),
        ("package it", ["integrate"]), ("sign the packages", ["package it"]),
        ("stage it", ["package it", "migrate old files"]), ("smoke test staging", ["stage it"]),
        ("deploy", ["smoke test staging", "security review", "load test"]),
        ("announce", ["deploy", "release notes"]), ("watch the graphs", ["deploy"])]


def layered(page, where):
    """Check the plan as a layered graph: a row per layer, each task one layer below its
    deepest blocker (as its arrows say), some arrow skipping a layer, and no arrow passing
    under a box that is not one of its ends."""
    tops, arrows = page.evaluate(DRAWN)
    blockers = {box: [a for a, b in arrows if b == box] for box in tops}
    depth = {}

    def deepest(box):
        if box not in depth:
            depth[box] = max([deepest(a) + 1 for a in blockers[box]], default=0)
        return depth[box]
    rows = {}
    for box in tops:
        rows.setdefault(deepest(box), set()).add(tops[box])
    check(f"{where} the plan is a row per layer, from what is ready down to what waits longest",
          all(len(y) == 1 for y in rows.values())
          and [min(rows[d]) for d in sorted(rows)] == sorted({min(y) for y in rows.values()})
          and len(rows) >= 4, rows)
    check(f"{where} some arrows skip layers",
          any(depth[b] - depth[a] >= 2 for a, b in arrows), arrows)
    crossings = page.evaluate(CROSSINGS)
    check(f"{where} no arrow passes under a box other than its two ends", not crossings,
          crossings[:5])


def act(url, op, args, token):
    """Call one operation as another agent, over REST; answer its body."""
    status, body = rest(url, op, args, token)
    assert status == 200, body
    return body


def until(page, expression, seconds=15):
    """Wait until EXPRESSION is true in the page (polled from here: the page's policy
    forbids the eval that Playwright's own wait_for_function uses)."""
    deadline = time.monotonic() + seconds
    while not page.evaluate(expression) and time.monotonic() < deadline:
        page.wait_for_timeout(100)


def session(page, url, db, you, bot, problems):
    """Walk through the page as a person would, checking each step."""
    page.goto(url + "/")
    page.fill("#token", "agora_not_a_real_token")
    page.click("#signin-form button")
    page.wait_for_selector("#signin-error:has-text('not accepted')")
    check("a bad token gets a clear message", "unknown token" in page.inner_text("#signin-error"))
    problems.clear()                # the browser logs that refused request as an error

    page.fill("#token", you)
    page.click("#signin-form button")
    page.wait_for_selector("#who:has-text('signed in as you')")
    # The title is set once the channel list has come back, a moment after the name.
    until(page, "document.querySelector('#channel-title').textContent === '#public'")
    check("signing in with a token shows the channels",
          page.is_visible("#tab-channels") and "#public" in page.inner_text("#channel-title"))
    check("the token is kept in sessionStorage",
          page.evaluate("sessionStorage.getItem('agora-token')") == you)

    page.fill("#channel-text", "hello from the browser")
    page.click("#channel-form button")
    page.wait_for_selector("#channel-messages li:has-text('hello from the browser')")
    seen = act(url, "history", {"channel": "public"}, bot)["messages"]
    check("posting from the page stores the message as that agent",
          ("you", "hello from the browser") in [(m["sender"], m["body"]) for m in seen])

    page.wait_for_timeout(300)                     # the page is now in its long-poll
    act(url, "post", {"body": HOSTILE}, bot)
    page.wait_for_selector("#channel-messages li:has-text('bot says hi')", timeout=15000)
    check("another agent's post arrives without a reload", True)
    check("a message with <script> is shown as text and never run",
          page.evaluate("window.pwned") is None and "<script>" in
          page.inner_text("#channel-messages li:last-child .text"))

    page.click("#channel-messages li:last-child .meta button")
    page.fill("#channel-text", "a reply from the browser")
    page.click("#channel-form button")
    page.wait_for_selector("#channel-messages li:has-text('a reply from the browser')")
    last = act(url, "history", {"channel": "public"}, bot)["messages"][-1]
    check("replying sets reply_to", last["reply_to"] == last["id"] - 1, last)

    act(url, "post", {"to": "you", "body": "psst, a direct word"}, bot)
    page.click("nav button[data-tab=direct]")
    page.click("#dm-list button:has-text('bot')")
    page.wait_for_selector("#dm-messages li:has-text('psst, a direct word')")
    page.fill("#dm-text", "got it")
    page.click("#dm-form button")
    page.wait_for_selector("#dm-messages li:has-text('got it')")
    check("direct conversations show both sides and send mail",
          act(url, "history", {"channel": "@you"}, bot)["messages"][-1]["body"] == "got it")

    task = act(url, "post_task", {"title": "review the parser", "tags": "review",
                                   "priority": 3}, bot)["id"]
    page.click("nav button[data-tab=tasks]")
    card = f"#board .column[data-state=open] .task[data-id='{task}']"
    page.wait_for_selector(card)
    page.click(f"{card} button:has-text('Claim')")
    page.wait_for_selector(f"#board .column[data-state=claimed] .task[data-id='{task}']")
    held = act(url, "task", {"id": task}, bot)["task"]
    check("claiming a task from the board", (held["status"], held["owner"]) == ("claimed", "you"))
    check("the board says what each agent holds", "you 1" in page.inner_text("#holding"))
    page.fill("#task-title", "written on the page")
    page.click("#task-form button")
    page.wait_for_selector("#board .column[data-state=open] .task:has-text('written on the page')")
    check("posting a task from the page", True)
    later = act(url, "post_task", {"title": "deploy it", "after": [task]}, bot)["id"]
    act(url, "reserve", {"paths": "src/parser/**", "reason": "parser rewrite"}, bot)
    page.click("nav button[data-tab=channels]")
    page.click("nav button[data-tab=tasks]")
    waiting = page.wait_for_selector(f"#board .column[data-state=waiting] .task[data-id='{later}']")
    check("a waiting task shows what it waits for, and no Claim button",
          f"waits for #{task}" in waiting.inner_text()
          and waiting.query_selector("button:has-text('Claim')") is None)
    # The reservations are asked for once the board is drawn.
    until(page, "document.querySelector('#reservations').textContent.includes('parser rewrite')")
    check("the project's reservations show who holds which paths",
          "src/parser/** bot (exclusive" in page.inner_text("#reservations")
          and "parser rewrite" in page.inner_text("#reservations"))

    act(url, "write_note", {"key": "design/api", "body": "first words"}, bot)
    act(url, "write_note", {"key": "design/api", "body": "second words"}, bot)
    page.click("nav button[data-tab=notes]")
    page.click("#note-list button:has-text('design/api')")
    page.wait_for_selector("#note-body:has-text('second words')")
    page.click("#note-versions button:has-text('v1')")
    page.wait_for_selector("#note-body:has-text('first words')")
    check("notes show with their revisions", True)

    team(page, url, db, bot)
    plan(page, url, bot)
    archived(page, db)

    page.click("nav button[data-tab=channels]")
    act(url, "post", {"body": "a very long line " + "x" * 600}, bot)
    page.wait_for_selector("#channel-messages li:has-text('a very long line')")
    overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
    check("a long message does not break the layout", not overflow)


def team(page, url, db, bot):
    """The Team tab: a row per agent with what it holds and reserves."""
    mint_token(db, "sleepy")
    connection = sqlite3.connect(db)
    with connection:                    # as if sleepy had last called 15 minutes ago
        connection.execute("UPDATE agents SET seen = seen - 900 WHERE name = 'sleepy'")
    connection.close()
    design = act(url, "post_task", {"title": "design the release"}, bot)["id"]
    act(url, "claim", {"id": design, "lease": 1800}, bot)
    act(url, "reserve", {"paths": "web/**", "project": "site", "exclusive": False,
                         "reason": HOSTILE_REASON}, bot)
    act(url, "edit", {"paths": ["docs/<img src=x onerror=window.pwned=1>.md"]}, bot)
    act(url, "brief", {"status": "reviewing the parser"}, bot)
    page.click("nav button[data-tab=team]")
    row = page.wait_for_selector("#team li[data-agent=bot]:has-text('reviewing the parser')")
    text = row.inner_text()
    check("the team row says status and last seen", "seen" in text and "idle" not in text, text)
    check("the team row shows the task the agent holds, with its lease",
          f"#{design} design the release" in text and "left" in text, text)
    check("the team row shows its reservations: pattern, kind, time left, why",
          "src/parser/**" in text and "exclusive" in text and "web/** in site · shared" in text
          and "hostile reason" in text, text)
    check("the team row shows the file the agent is editing, and since when",
          re.search(r"editing docs/<img src=x onerror=window.pwned=1>.md, \d+s", text), text)
    check("a reservation's reason with markup is shown as text",
          "<img src=x" in text and page.evaluate("window.pwned") is None)
    mine = page.inner_text("#team li[data-agent=you]")
    check("the viewer sees its own unread count and nobody else's",
          "unread" in mine and "unread" not in text, mine)
    sleepy = page.query_selector("#team li[data-agent=sleepy]")
    check("an agent not seen for 10 minutes looks idle", "idle" in sleepy.get_attribute("class")
          and "idle, seen 15m ago" in sleepy.inner_text(), sleepy.inner_text())
    page.screenshot(path=os.path.join(SHOTS, "e2e-team-laptop.png"))
    page.click(f"#team li[data-agent=bot] li[data-task='{design}'] button")
    card = page.wait_for_selector(f"#plan-card .task[data-id='{design}']")
    check("a held task in the team opens on the plan", "held by bot" in card.inner_text())


def archived(page, db):
    """A channel whose old messages a prune moved to an archive says where they went."""
    sys.path.insert(0, ROOT)
    import agora
    bot, day = agora.Caller("bot", True), 86400
    old = int(time.time()) - 40 * day
    store = agora.Store(db)
    try:
        agora.call(store, "create_channel", {"name": "attic"}, bot, old)
        for i in range(3):
            agora.call(store, "post", {"body": f"old news {i}", "channel": "attic"}, bot, old + i)
        agora.call(store, "post", {"body": "kept news", "channel": "attic"}, bot, old + 39 * day)
        while agora.prune(store, 30 * day, int(time.time())):
            pass
    finally:
        store.close()
    month = agora.month_of(old)
    page.click("nav button[data-tab=channels]")
    page.click("#channel-list button:has-text('attic')")
    older = page.wait_for_selector("#channel-messages li.older")
    shown = page.inner_text("#channel-messages")
    check("a channel says where its archived messages went, above what is kept",
          older.inner_text() == f"older messages: archive {month} ({agora.archive_name(month)})"
          and "kept news" in shown and "old news" not in shown, shown)
    page.click("#channel-list button:has-text('public')")


def plan(page, url, bot):
    """The Plan on the board: a box per unfinished task, an arrow per dependency."""
    ids = {"design the release": act(url, "tasks", {"which": "mine"}, bot)["tasks"][0]["id"]}
    for title, after in PLAN[1:]:
        ids[title] = act(url, "post_task", {"title": title,
                                             "after": [ids[a] for a in after]}, bot)["id"]
    spike = act(url, "post_task", {"title": "spike the cache"}, bot)["id"]
    act(url, "claim", {"id": spike}, bot)
    act(url, "done", {"id": spike, "result": "too slow", "failed": True}, bot)
    act(url, "post_task", {"title": HOSTILE_TITLE, "after": [spike, ids["write the api"]]}, bot)
    dropped = act(url, "post_task", {"title": "try the old cache"}, bot)["id"]
    act(url, "cancel", {"id": dropped}, bot)
    act(url, "post_task", {"title": "port the old cache",
                           "after": [dropped, ids["test the store"]]}, bot)
    page.click("nav button[data-tab=tasks]")

    def expected():
        unfinished = act(url, "tasks", {"which": "unfinished", "limit": 200}, bot)["tasks"]
        stuck = {b for t in unfinished for b in t["waiting_for"]} - {t["id"] for t in unfinished}
        return (len(unfinished) + len(stuck), sum(len(t["waiting_for"]) for t in unfinished),
                len(unfinished))

    def drawn():
        return page.evaluate("[document.querySelectorAll('#plan g.node').length, "
                             "document.querySelectorAll('#plan path.arrow').length, "
                             "document.querySelectorAll('#board .column:is([data-state=open], "
                             "[data-state=waiting], [data-state=claimed]) .task').length]")

    boxes, arrows, unfinished = expected()
    until(page, f"document.querySelectorAll('#plan g.node').length === {boxes}")
    check("the plan draws a box per unfinished task (and per failed blocker) and an arrow "
          "per dependency, as the board has them", drawn() == [boxes, arrows, unfinished]
          and boxes >= 30, (drawn(), boxes, arrows, unfinished))
    states = page.evaluate("Object.fromEntries([...document.querySelectorAll('#plan g.node')]"
                           ".map((g) => [g.dataset.id, [...g.classList].filter((c) => "
                           "c !== 'node' && c !== 'picked').join(' ')]))")
    check("boxes are coloured by state: claimed, ready, waiting, failed",
          states[str(ids["design the release"])] == "claimed"
          and states[str(ids["write the api"])] == "waiting"
          and states[str(spike)] == "failed" and "ready" in states.values(), states)
    behind = page.evaluate("[...document.querySelectorAll('#plan g.node.stuck')].map((g) => "
                           "[g.dataset.id, g.getAttribute('aria-label').split(', ').pop(), "
                           "g.querySelector('text.sub').textContent])")
    check("a task behind a failed blocker, and one behind a cancelled one, are drawn and "
          "labelled stuck (in full to a screen reader, cut to fit the box if need be)",
          sorted(label for _, label, _ in behind) ==
          [f"stuck: #{spike} failed", f"stuck: #{dropped} cancelled"]
          and all(label.startswith(shown.rstrip("…")) and shown.startswith("stuck: #")
                  for _, label, shown in behind), behind)
    for stuck, label, _ in behind:
        page.click(f"#plan g.node[data-id='{stuck}']")
        card = page.wait_for_selector(f"#plan-card .task[data-id='{stuck}']")
        check(f"its card says it is stuck, and on what ({label})", label in card.inner_text(),
              card.inner_text())
    layers = page.evaluate("Object.fromEntries([...document.querySelectorAll('#plan g.node')]"
                           ".map((g) => [g.dataset.id, +g.querySelector('rect')"
                           ".getAttribute('y')]))")
    check("layers run from what is ready to what waits longest",
          layers[str(ids["design the release"])] < layers[str(ids["write the api"])]
          < layers[str(ids["test the api"])] < layers[str(ids["integrate"])]
          < layers[str(ids["deploy"])] < layers[str(ids["announce"])], layers)
    crowded = page.evaluate("""(() => {
        const rects = [...document.querySelectorAll('#plan rect')].map((r) => r.getBBox());
        const overlaps = rects.filter((a, i) => rects.some((b, j) => i !== j &&
          a.x + a.width > b.x && b.x + b.width > a.x &&
          a.y + a.height > b.y && b.y + b.height > a.y)).length;
        const spilling = [...document.querySelectorAll('#plan g.node text')].filter((t) => {
          const box = t.parentNode.querySelector('rect').getBBox(), line = t.getBBox();
          return line.x + line.width > box.x + box.width - 4; }).map((t) => t.textContent);
        return [overlaps, spilling]; })()""")
    check("no two boxes overlap and every line of text fits its box", crowded == [0, []],
          crowded)
    hostile = page.evaluate("[...document.querySelectorAll('#plan g.node')].map((g) => "
                            "g.textContent).find((text) => text.includes('hostile title'))")
    check("a task title with <script> is text in the plan and never runs",
          "<script>" in hostile and page.evaluate("window.pwned") is None, hostile)
    layered(page, "on a laptop")
    check("thirty tasks fit a laptop's width", page.evaluate(FITS))
    page.screenshot(path=os.path.join(SHOTS, "e2e-plan-laptop.png"))

    page.click(f"#plan g.node[data-id='{ids['write the store']}']")
    card = page.wait_for_selector(f"#plan-card .task[data-id='{ids['write the store']}']")
    check("clicking a box shows its task", "waits for #" in card.inner_text(), card.inner_text())

    act(url, "done", {"id": ids["design the release"], "result": "agreed"}, bot)
    page.wait_for_selector(f"#plan g.node.ready[data-id='{ids['write the store']}']",
                           timeout=15000)
    boxes, arrows, unfinished = expected()
    until(page, f"document.querySelectorAll('#plan path.arrow').length === {arrows}")
    card = page.query_selector("#plan-card .task")
    check("the plan updates when a blocker is done", drawn() == [boxes, arrows, unfinished]
          and page.query_selector(f"#plan g.node[data-id='{ids['design the release']}']") is None
          and "waits for" not in card.inner_text()
          and card.query_selector("button:has-text('Claim')") is not None, (drawn(), boxes, arrows))


def decisions(browser, work, problems):
    """People in the loop on a phone: an agent asks ann and ben a decision each, with a task
    after it; each one's ntfy receiver (on loopback) gets one notice whose Click link, signed
    in, answers it in two taps: ann approves, and the agent's `news wait` hears at once that
    its task is ready; ben declines with a reason, and the agent hears that."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    got = []

    class Ntfy(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.path, dict(self.headers), body.decode()))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Ntfy)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    ntfy = f"http://127.0.0.1:{receiver.server_address[1]}"
    db = os.path.join(work, "people.db")
    server, url = start_server(db, "--notify-private")
    try:
        tokens = {}
        for person in ("ann", "ben"):
            tokens[person] = json.loads(subprocess.run(
                [sys.executable, AGORA, "join", f"name={person}", "person=true", "--json",
                 "--db", db], check=True, capture_output=True, text=True).stdout)["token"]
            status, _ = rest(url, "profile", {"notify": f"ntfy:{ntfy}/{person}"}, tokens[person])
            check(f"{person} sets where she is told, with her own token", status == 200)
        asker = mint_token(db, "asker")
        time.sleep(61)                      # neither is on the page now
        asked = {}
        for person, title in (("ann", "drop the legacy table?"), ("ben", "rewrite the parser?")):
            decision = act(url, "post_task", {"title": title, "for": person, "body": HOSTILE},
                           asker)["id"]
            after = act(url, "post_task", {"title": f"then, {person}", "after": [decision]},
                        asker)["id"]
            asked[person] = (decision, after)
        deadline = time.monotonic() + 90
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        by = {path.strip("/"): (headers, body) for path, headers, body in got}
        check("each person's ntfy receiver got one notice", sorted(by) == ["ann", "ben"]
              and len(got) == 2, got)
        for person, (headers, body) in by.items():
            check(f"{person}'s notice: a Title, the decision, and a Click link to it",
                  headers.get("Title") == "1 thing needs you in agora"
                  and headers.get("Click") == f"{url}/#task-{asked[person][0]}"
                  and f"asker asks you (task #{asked[person][0]})" in body, (headers, body))
        act(url, "read", {"limit": 200}, asker)
        act(url, "news", {"tasks": True}, asker)            # what came before is told
        for person, approve in (("ann", True), ("ben", False)):
            decision, after = asked[person]
            context = browser.new_context(viewport={"width": 390, "height": 844})
            phone = context.new_page()
            phone.on("pageerror", lambda error: problems.append(str(error)))
            phone.goto(by[person][0]["Click"])
            phone.fill("#token", tokens[person])
            phone.check("#keep")
            phone.click("#signin-form button.primary")
            need = f"#needs li[data-id='{decision}']"
            phone.wait_for_selector(need)
            check(f"{person}: the link opens the page at Needs you, the decision first",
                  phone.is_visible(need) and phone.evaluate(
                      "document.documentElement.scrollWidth <= window.innerWidth"))
            check(f"{person}: hostile text in a decision stays text",
                  "<script>" in phone.inner_text(need)
                  and phone.evaluate("window.pwned === undefined"))
            if approve:
                phone.screenshot(path=os.path.join(SHOTS, "e2e-needs-you-phone.png"))
            heard = {}

            def wait_news():
                heard["body"] = act(url, "news", {"wait": 30, "tasks": True}, asker)
                heard["at"] = time.monotonic()
            waiting = threading.Thread(target=wait_news)
            waiting.start()
            time.sleep(0.5)                 # the news wait is parked
            phone.click(f"{need} button:has-text('{'Approve' if approve else 'Decline'}')")
            if not approve:
                phone.fill(f"{need} textarea", "not before the release")
            phone.screenshot(path=os.path.join(SHOTS, f"e2e-decision-{person}-phone.png"))
            phone.click(f"{need} form button:has-text('{'Approve' if approve else 'Decline'} #')")
            tapped = time.monotonic()
            waiting.join(35)
            news = heard.get("body", {})
            told = " ".join(message["preview"] for message in news.get("messages", []))
            word = "approved" if approve else "declined"
            check(f"{person} {word} in two taps; the agent's news wait heard within 1 s",
                  heard and heard["at"] - tapped <= 1.0 and f"{person} {word} your task" in told,
                  (heard.get("at", 0) - tapped, told))
            if approve:
                check("approved: the task after it is ready, and news says so",
                      f"#{after} \"then, ann\" is ready" in told, told)
            record = act(url, "task", {"id": decision}, asker)["task"].get("decision", {})
            check(f"{person}'s decision kept: who, the words, through the page",
                  (record.get("answer"), record.get("by"), record.get("via"))
                  == (word, person, "web")
                  and (approve or record.get("words") == "not before the release"), record)
            check(f"{person} stays signed in on this device",
                  phone.evaluate("localStorage.getItem('agora-token')") == tokens[person])
            context.close()
    finally:
        log = stop_server(server)
        receiver.shutdown()
        receiver.server_close()
    check("no traceback in the people server's log", "Traceback" not in log, log[-300:])


def main():
    """Run the browser session; answer the exit status."""
    from playwright.sync_api import sync_playwright
    work = tempfile.mkdtemp(prefix="agora-e2e-")
    db = os.path.join(work, "agora.db")
    server, url = start_server(db)
    you, bot = mint_token(db, "you"), mint_token(db, "bot")
    problems = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--no-first-run"])
            def watched(viewport):
                """A new page whose script errors and console errors (a CSP violation
                is one) land in problems."""
                page = browser.new_page(viewport=viewport)
                page.on("pageerror", lambda error: problems.append(str(error)))
                page.on("console", lambda message: problems.append(message.text)
                        if message.type == "error" else None)
                return page
            page = watched({"width": 1280, "height": 860})
            session(page, url, db, you, bot, problems)
            page.screenshot(path=os.path.join(SHOTS, "e2e-laptop.png"))
            phone = watched({"width": 390, "height": 800})
            phone.goto(url + "/")
            phone.fill("#token", you)
            phone.click("#signin-form button")
            phone.wait_for_selector("#channel-messages li:has-text('a very long line')")
            wider = "document.documentElement.scrollWidth > window.innerWidth"
            check("readable on a phone: nothing wider than the screen",
                  not phone.evaluate(wider))
            check("every tab fits a phone's width", phone.evaluate(
                "[...document.querySelectorAll('nav button')].every((b) => "
                "b.getBoundingClientRect().right <= window.innerWidth)"))
            phone.screenshot(path=os.path.join(SHOTS, "e2e-phone.png"))
            phone.click("nav button[data-tab=team]")
            phone.wait_for_selector("#team li[data-agent=bot]")
            check("the team fits a phone", not phone.evaluate(wider))
            phone.screenshot(path=os.path.join(SHOTS, "e2e-team-phone.png"))
            phone.click("nav button[data-tab=tasks]")
            phone.wait_for_selector("#plan g.node")
            layered(phone, "on a phone")
            check("on a phone the plan scrolls sideways in its own frame, never the page",
                  not phone.evaluate(wider) and phone.evaluate(
                      "getComputedStyle(document.querySelector('#plan-wrap')).overflowX")
                  == "auto")
            phone.screenshot(path=os.path.join(SHOTS, "e2e-plan-phone.png"))
            for form, tab in (("#task-form", "tasks"), ("#note-form", "notes"),
                              ("#channel-form", "channels")):
                phone.click(f"nav button[data-tab={tab}]")
                phone.wait_for_selector(form)
                spilling = phone.evaluate(f"""(() => {{
                    const card = document.querySelector('{form}').getBoundingClientRect();
                    return [...document.querySelectorAll('{form} button')].filter((b) => {{
                        const r = b.getBoundingClientRect();
                        return r.bottom > card.bottom + 0.5 || r.right > card.right + 0.5;
                    }}).map((b) => b.textContent);
                }})()""")
                check(f"on a phone {form}'s buttons stay inside its card", not spilling,
                      spilling)
            phone.click("nav button[data-tab=direct]")
            phone.click("#dm-list button:has-text('sleepy')")
            empty = phone.wait_for_selector("#dm-messages li.empty")
            check("an empty conversation says what will appear there",
                  "no messages between you and sleepy yet" in empty.inner_text(),
                  empty.inner_text())
            page.click("#signout")
            check("signing out forgets the token", page.is_visible("#signin") and
                  page.evaluate("sessionStorage.getItem('agora-token')") is None)
            decisions(browser, work, problems)
            browser.close()
    finally:
        log = stop_server(server)
        shutil.rmtree(work, ignore_errors=True)
    check("no script errors or policy violations in the page", not problems, problems[:3])
    check("no traceback in the server log", "Traceback" not in log, log[-300:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
