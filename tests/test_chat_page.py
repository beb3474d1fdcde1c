#!/usr/bin/env python3
"""test_chat_page.py - the chat page of `pipeshard serve` (GET /) in a real headless browser: Debian's
chromium and chromium-driver, driven by selenium (scripts/setup.sh installs all three), on
SmolLM2-135M-Instruct behind an API key.

1. The page loads from the binary alone (no other request than / and the API's).
2. Without the key, a question gets the server's 401 message in the page.
3. With the key typed into its field, a question typed and sent with Enter gets an answer that
   streams (the text grows over several looks before it is done), and tokens/s are shown.
4. A second question goes with the first turn (the page keeps the conversation): the server's
   prefix cache counts the first turn's tokens as reused.
Skips (exit 77, with a message) only when chromium, chromedriver or selenium is missing.
"""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, conclude, require, skip, tmpdir  # noqa: E402
from psserve import Server  # noqa: E402

MODEL = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
KEY = "page-key-42"
LIMIT = 120


def browser():
    """A headless chromium under selenium, or None (after skip()) when one is not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip("the Python package selenium is missing (scripts/setup.sh installs it): the chat page was not tested")
        return None
    if not chromium or not driver:
        skip("chromium or chromedriver is not installed (scripts/setup.sh installs chromium and chromium-driver): "
             "the chat page was not tested")
        return None
    o = webdriver.ChromeOptions()
    o.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--disable-extensions", "--window-size=1000,800"):
        o.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=o)


def wait(what, cond, limit=LIMIT):
    """Polls cond every 20 ms until it returns something true; require()s it and returns it."""
    deadline = time.time() + limit
    v = cond()
    while not v and time.time() < deadline:
        time.sleep(0.02)
        v = cond()
    require(v, f"waited {limit} s for {what}")
    return v


def ask(d, text):
    """Types text into the page and sends it with Enter; returns the lengths the answer's text had
    at each look while it streamed, and the answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    n = len(d.find_elements(By.CSS_SELECTOR, ".msg"))
    box = d.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    out = wait("the answer's bubble", lambda: (m := d.find_elements(By.CSS_SELECTOR, ".msg")) and len(m) >= n + 2
               and m[n + 1])
    seen = []
    deadline = time.time() + LIMIT
    while time.time() < deadline:
        t = out.text
        if not seen or len(t) != seen[-1]:
            seen.append(len(t))
        if d.find_element(By.ID, "send").is_enabled() and d.find_element(By.ID, "stop").get_attribute("disabled"):
            break
        time.sleep(0.01)
    return seen, out


def main():
    t0 = time.time()
    tmp = tmpdir("chat-page-")
    if not os.path.exists(MODEL):
        skip(f"{MODEL} is absent (scripts/setup.sh fetches it): the chat page was not tested")
        return conclude(tmp, t0)
    d = browser()
    if d is None:
        return conclude(tmp, t0)
    key = os.path.join(tmp, "key")
    with open(key, "w") as f:
        f.write(KEY + "\n")
    try:
        from selenium.webdriver.common.by import By
        with Server(["-m", MODEL, "--mmap", "-t", "2", "-c", "1024", "--api-key-file", key], "page", tmp) as s:
            d.get(s.url + "/")
            require("pipeshard" in d.title, f"the page's title is {d.title!r}")
            d.find_element(By.ID, "max").send_keys("40")
            # no key: the 401 shows in the page
            seen, out = ask(d, "Hello?")
            check("401" in out.text and "API key" in out.text and "error" in out.get_attribute("class"),
                  f"without the key the page shows {out.text!r}")
            d.find_element(By.ID, "reset").click()
            # the key, then a question: a streamed answer and tokens/s
            k = d.find_element(By.ID, "key")
            k.send_keys(KEY)
            d.execute_script("arguments[0].dispatchEvent(new Event('change'))", k)
            wait("the model's name", lambda: "SmolLM2" in d.find_element(By.ID, "model").text)
            seen, out = ask(d, "What is the capital of France?")
            stats = d.find_element(By.ID, "stats").text
            check(out.text.strip() and "error" not in out.get_attribute("class"), f"the answer: {out.text!r}")
            growing = [n for n in seen if n > 0]
            check(len(growing) >= 2, f"the answer did not stream: its lengths over time were {seen}")
            check("tokens/s" in stats, f"the stats line says {stats!r}")
            print(f"  ok: a streamed answer ({len(growing)} looks at a growing text): {out.text[:60]!r}; {stats}")
            # the second turn carries the first: the server reuses its keys and values
            before = s.metrics({"Authorization": f"Bearer {KEY}"})["pipeshard_prefix_cache_tokens_total"]
            seen, out2 = ask(d, "And of Germany?")
            after = s.metrics({"Authorization": f"Bearer {KEY}"})["pipeshard_prefix_cache_tokens_total"]
            msgs = d.find_elements(By.CSS_SELECTOR, ".msg")
            check(len(msgs) == 4 and out2.text.strip(), f"{len(msgs)} messages after two turns")
            check(after - before > 20, f"the second turn reused {after - before} tokens: not sent with the first?")
            logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"] if hasattr(d, "get_log") else []
            check(all("401" in e.get("message", "") for e in logs), f"browser console errors: {logs}")
    finally:
        d.quit()
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
