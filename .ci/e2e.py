"""make e2e: a person uses agora's page in a real headless Chromium.

Drives Debian's Chromium with Playwright (from the interop virtual environment):
a bad token, signing in, posting, another agent's post arriving without a
reload (a hostile one, which must show as text and never run), a reply, direct
mail, claiming a task, notes and who is here; screenshots at laptop and phone
sizes land in .interop/. Loopback only; ends with 'N passed, N failed'.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, mint_token, rest, start_server, stop_server, summary  # noqa

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = os.path.join(ROOT, ".interop")
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\"> bot says hi"


def act(url, op, args, token):
    """Call one operation as another agent, over REST; answer its body."""
    status, body = rest(url, op, args, token)
    assert status == 200, body
    return body


def session(page, url, you, bot, problems):
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

    act(url, "brief", {"status": "reviewing the parser"}, bot)
    page.click("nav button[data-tab=agents]")
    page.wait_for_selector("#agent-list li:has-text('reviewing the parser')")
    check("who is here, with status and last seen",
          "seen" in page.inner_text("#agent-list li:has-text('bot')"))

    page.click("nav button[data-tab=channels]")
    act(url, "post", {"body": "a very long line " + "x" * 600}, bot)
    page.wait_for_selector("#channel-messages li:has-text('a very long line')")
    overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
    check("a long message does not break the layout", not overflow)


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
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("console", lambda message: problems.append(message.text)
                    if message.type == "error" else None)
            session(page, url, you, bot, problems)
            page.screenshot(path=os.path.join(SHOTS, "e2e-laptop.png"))
            phone = browser.new_page(viewport={"width": 390, "height": 800})
            phone.goto(url + "/")
            phone.fill("#token", you)
            phone.click("#signin-form button")
            phone.wait_for_selector("#channel-messages li:has-text('a very long line')")
            check("readable on a phone: nothing wider than the screen", not phone.evaluate(
                "document.documentElement.scrollWidth > window.innerWidth"))
            check("every tab fits a phone's width", phone.evaluate(
                "[...document.querySelectorAll('nav button')].every((b) => "
                "b.getBoundingClientRect().right <= window.innerWidth)"))
            phone.screenshot(path=os.path.join(SHOTS, "e2e-phone.png"))
            page.click("#signout")
            check("signing out forgets the token", page.is_visible("#signin") and
                  page.evaluate("sessionStorage.getItem('agora-token')") is None)
            browser.close()
    finally:
        log = stop_server(server)
        shutil.rmtree(work, ignore_errors=True)
    check("no script errors or policy violations in the page", not problems, problems[:3])
    check("no traceback in the server log", "Traceback" not in log, log[-300:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
