"""The chat page at /: one static document with nothing external, and in
headless Chromium (Debian's chromium and chromium-driver, driven through
selenium) a question typed into it streams an answer, shown with its
usage.dualpath line; the page is saved as a screenshot in the log folder."""
import os
import re
import shutil

import pytest

from conftest import request


def test_page_is_served_whole(server):
    st, h, body = request("GET", "/")
    assert st == 200
    assert h["Content-Type"].startswith("text/html")
    assert "connect-src 'self'" in h["Content-Security-Policy"]
    page = body.decode()
    assert "<title>dualpathd</title>" in page
    # No external assets: no URL to anywhere else, no src= or href= at all.
    assert not re.search(r"https?://", page)
    assert not re.search(r"\b(src|href)\s*=", page)
    st, _, b = request("HEAD", "/")
    assert st == 200 and b == b""


def _driver():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    chrome = shutil.which("chromium")
    drv = shutil.which("chromedriver")
    if not chrome or not drv:
        pytest.skip("chromium and chromium-driver are not installed (scripts/deps.sh installs them)")
    o = webdriver.ChromeOptions()
    o.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1100,760"):
        o.add_argument(a)
    return webdriver.Chrome(service=Service(drv), options=o)


@pytest.mark.heavy
def test_chat_in_the_browser(server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    d = _driver()
    try:
        d.get(server + "/")
        # A bound on a hang, not a speed test: the verdict waits on the page's state.
        wait = WebDriverWait(d, 300)
        wait.until(lambda x: x.find_element(By.ID, "model").text != "")
        for field, value in (("temp", "0"), ("maxt", "64")):  # greedy, short answers
            e = d.find_element(By.ID, field)
            e.clear()
            e.send_keys(value)
        box = d.find_element(By.ID, "q")
        box.send_keys("What is the capital of France?")
        d.find_element(By.ID, "send").click()
        done = wait.until(lambda x: x.find_elements(By.CSS_SELECTOR, ".msg.assistant.done"))
        answer = done[0]
        text = answer.find_element(By.CSS_SELECTOR, ".text").text
        usage = answer.find_element(By.CSS_SELECTOR, ".usage").text
        assert text.strip() and "[error" not in text, text
        assert "generated tokens" in usage and "dual path:" in usage and "KV" in usage, usage
        # A second turn carries the first (the conversation is resent).
        box.send_keys("And of Italy?")
        d.find_element(By.ID, "send").click()
        wait.until(lambda x: len(x.find_elements(By.CSS_SELECTOR, ".msg.assistant.done")) == 2)
        assert len(d.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
        out = os.environ.get("DUALPATHD_LOGDIR", "/tmp")
        d.save_screenshot(os.path.join(out, "chat-page.png"))
    finally:
        d.quit()
