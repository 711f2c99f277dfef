#!/usr/bin/env python3
"""The dashboard in a real browser: headless Debian chromium driven by Selenium (run by ui.test.sh).

Usage: ui_browser.py BASE TOKEN_BASE TOKEN UPSTREAM SHOTS_DIR
BASE is a server without a token, TOKEN_BASE one started with --token TOKEN; both fetch from UPSTREAM.
Prints one line per step and the 10,000-node first-paint figures; exits 1 on the first failure.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

BASE, TOKEN_BASE, TOKEN, UPSTREAM, SHOTS = sys.argv[1:6]
os.makedirs(SHOTS, exist_ok=True)


def step(text):
    print(f"[ui.test] -- {text}", flush=True)


def api(method, path, body=None, base=BASE, token=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def fetch(url):
    return {"type": "fetch", "url": UPSTREAM + url}


options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
            "--no-first-run", "--disable-extensions", "--disable-background-networking"]:
    options.add_argument(arg)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(options=options, service=Service(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver")))
driver.set_page_load_timeout(20)
console = []


def wait(condition, seconds=10, message="condition"):
    # A condition that reads elements the page replaces meanwhile (the jobs list renders again as jobs change) is
    # asked again, not failed: a stale element says only that the page moved on between finding it and reading it.
    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.05,
                             ignored_exceptions=(StaleElementReferenceException,)).until(condition)
    except TimeoutException:
        shot("failure")
        raise SystemExit(f"FAIL ui.test: timed out after {seconds}s waiting for {message}")


def css(selector):
    return lambda d: d.find_element(By.CSS_SELECTOR, selector) if d.find_elements(By.CSS_SELECTOR, selector) else False


def js(script, *args):
    return driver.execute_script(script, *args)


def shot(name):
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def collect_console():
    console.extend(driver.get_log("browser"))


def row_ids():
    # Read in one script: the list is drawn again as it refreshes, and a row found before a drawing is stale after it.
    return js("return Array.from(document.querySelectorAll('#jobs-table tr[data-job-id]'), r => r.dataset.jobId)")


def follows(page, previous):
    return len(page) == 50 and page[0] < previous[-1]


def check(condition, message):
    if not condition:
        shot("failure")
        raise SystemExit(f"FAIL ui.test: {message}")


try:
    # ------------------------------------------------------------------ jobs list
    step("load /ui: the jobs list, then a job submitted meanwhile appears without a reload")
    driver.get(BASE + "/ui")
    wait(lambda d: js("return performance.getEntriesByName('jobs-view-painted').length") == 1, 10, "the jobs list's first paint")
    list_ms = js("return performance.getEntriesByName('jobs-view-painted')[0].startTime")
    print(f"[ui.test] jobs list with 100,001 jobs stored: first paint {list_ms:.0f} ms after navigation", flush=True)
    check(list_ms <= 1000, f"the jobs list took {list_ms:.0f} ms to paint (> 1 s)")
    check(len(driver.find_elements(By.CSS_SELECTOR, "#jobs-table tr[data-job-id]")) == 50, "the first page does not hold 50 jobs")
    wait(lambda d: "100001" in d.find_element(By.CSS_SELECTOR, '.count[data-state="succeeded"]').text, 5, "the count of 100,001 succeeded jobs")
    step("cursor paging: older, then newer again")
    first_page = row_ids()
    driver.find_element(By.XPATH, "//button[contains(., 'older')]").click()
    wait(lambda d: "page 2" in d.find_element(By.CSS_SELECTOR, ".pager").text, 5, "page 2")
    wait(lambda d: follows(row_ids(), first_page), 5, "page 2's 50 rows, older than page 1's")
    driver.find_element(By.XPATH, "//button[contains(., 'newer')]").click()
    wait(lambda d: "page 1" in d.find_element(By.CSS_SELECTOR, ".pager").text, 5, "page 1 again")
    js("window.__sameDocument = true")
    status, job = api("POST", "/v1/jobs", {"name": "live-tree", "metadata": {"by": "ui.test"}, "graph": {
        "type": "list", "children": [fetch("/delay/4000"), fetch("/delay/5000"),
                                     {"type": "sequence", "children": [fetch("/json"), fetch("/delay/3000")]}]}})
    check(status == 201, f"submit answered {status}")
    live_id = job["id"]
    wait(css(f'tr[data-job-id="{live_id}"]'), 8, "the submitted job's row")
    shot("jobs-first")

    # ------------------------------------------------------------------ one job, live
    step("open it: nodes turn from running to succeeded without reloading")
    driver.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{live_id}"] a').click()
    wait(css("#job-view .tree-row"), message="the node tree")
    wait(lambda d: d.find_elements(By.CSS_SELECTOR, '.tree-row[data-state="running"]'), 8, "a running node")
    shot("job-running")
    wait(lambda d: js("return document.querySelector('#job-state').dataset.state") == "succeeded", 15, "the job to succeed")
    wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, '.tree-row[data-state="succeeded"]')) == 6, 5,
         "all 6 nodes succeeded in the tree")
    check(js("return window.__sameDocument === true"), "the page was reloaded")
    step("a node's result, request and raw body are one click away")
    driver.find_element(By.CSS_SELECTOR, '.tree-row[data-node-id="root.2.0"]').click()
    wait(lambda d: '"ok": true' in d.find_element(By.CSS_SELECTOR, "#node-output").text, 5, "the node's result")
    driver.find_element(By.CSS_SELECTOR, 'button[data-tab="Raw body"]').click()
    wait(lambda d: d.find_element(By.CSS_SELECTOR, "#node-output").text.strip() == '{"ok":true}', 5, "the raw body")
    driver.find_element(By.CSS_SELECTOR, 'button[data-tab="Request"]').click()
    wait(lambda d: "/json" in d.find_element(By.CSS_SELECTOR, "#node-output").text, 5, "the resolved request")
    shot("job")

    # ------------------------------------------------------------------ cancel
    step("cancel a running job from its page and see it cancelled")
    status, job = api("POST", "/v1/jobs", {"name": "to-cancel", "graph": {"type": "list", "children": [
        fetch("/delay/30000"), fetch("/delay/30000")]}})
    check(status == 201, f"submit answered {status}")
    driver.get(f"{BASE}/ui#/jobs/{job['id']}")
    wait(lambda d: d.find_elements(By.CSS_SELECTOR, '.tree-row[data-state="running"]'), 8, "a running node")
    driver.find_element(By.CSS_SELECTOR, "#cancel-job").click()
    WebDriverWait(driver, 5).until(EC.alert_is_present()).accept()
    wait(lambda d: js("return document.querySelector('#job-state').dataset.state") == "cancelled", 10, "state cancelled")
    wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, '.tree-row[data-state="cancelled"]')) == 3, 5,
         "every node cancelled in the tree")
    check(api("GET", f"/v1/jobs/{job['id']}")[1]["state"] == "cancelled", "the server does not say cancelled")
    check(js("return [...document.querySelector('.job-sections').childNodes].every(n => n.nodeName === 'DETAILS')"),
          "stray text beside the job's sections")
    check("cancelled" in driver.find_element(By.CSS_SELECTOR, ".block.error").text, "the job's error is not shown")
    shot("job-cancelled")

    # ------------------------------------------------------------------ submit, invalid
    step("submit an invalid job: the 422's path is marked in the text")
    driver.get(BASE + "/ui#/submit")
    area = wait(css("#job-json"), message="the submit form")
    bad = json.dumps({"name": "bad", "graph": {"type": "list", "children": [
        {"type": "fetch", "url": UPSTREAM + "/json"}, {"type": "fetch", "url": "ftp://example.test/x"}]}}, indent=2)
    js("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))", area, bad)
    driver.find_element(By.CSS_SELECTOR, "#submit-job").click()
    mark = wait(css("#error-mark"), 5, "the marked error")
    check(mark.text == '"ftp://example.test/x"', f"marked {mark.text!r}, not the bad url")
    check(mark.get_attribute("data-pointer") == "/graph/children/1/url", f"pointer {mark.get_attribute('data-pointer')}")
    check("scheme" in driver.find_element(By.CSS_SELECTOR, "#submit-error").text, "the error message is not shown")
    selected = js("const t = document.querySelector('#job-json'); return t.value.slice(t.selectionStart, t.selectionEnd)")
    check(selected == '"ftp://example.test/x"', f"the text area selects {selected!r}")
    shot("submit-error")
    step("a valid job from the form opens its page")
    good = json.dumps({"name": "from-form", "graph": fetch("/json")})
    js("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))", area, good)
    driver.find_element(By.CSS_SELECTOR, "#submit-job").click()
    wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#job-view") and
         js("return document.querySelector('#job-state') && document.querySelector('#job-state').dataset.state") == "succeeded",
         10, "the submitted job's page, succeeded")

    # ------------------------------------------------------------------ overview
    step("the overview from /metrics")
    driver.get(BASE + "/ui#/overview")
    wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".card")) == 4, 5, "the overview cards")
    shot("overview")

    # ------------------------------------------------------------------ 10,000 nodes
    step("a 10,000-node job: first paint of its view, scrolling")
    children = [fetch("/delay/20000")] + [fetch(f"/json?n={i}") for i in range(9998)]
    status, big = api("POST", "/v1/jobs", {"name": "ten-thousand", "graph": {"type": "sequence", "children": children}})
    check(status == 201, f"the 10,000-node job: {status} {big}")
    collect_console()
    driver.get("about:blank")
    driver.get(f"{BASE}/ui#/jobs/{big['id']}")
    wait(lambda d: js("return document.body.dataset.jobViewPainted === '1'"), 15, "the job view's first paint")
    figures = js("""
        const m = performance.getEntriesByName('job-view', 'measure')[0];
        const p = performance.getEntriesByName('job-view-painted', 'mark')[0];
        const fcp = performance.getEntriesByName('first-contentful-paint')[0];
        return {view_ms: m.duration, since_navigation_ms: p.startTime, fcp_ms: fcp ? fcp.startTime : null,
                rows_in_dom: document.querySelectorAll('.tree-row').length};
    """)
    print(f"[ui.test] 10,000-node job view: first paint {figures['since_navigation_ms']:.0f} ms after navigation "
          f"(view's own work {figures['view_ms']:.0f} ms; first contentful paint {figures['fcp_ms']}; "
          f"{figures['rows_in_dom']} rows in the DOM)", flush=True)
    check(figures["since_navigation_ms"] <= 1000, f"first paint took {figures['since_navigation_ms']:.0f} ms (> 1 s)")
    check(figures["rows_in_dom"] < 200, f"{figures['rows_in_dom']} rows drawn: the tree is not virtualised")
    check(driver.find_element(By.CSS_SELECTOR, ".tree-panel h2").text.endswith("(10000)"), "the tree does not count 10000 nodes")
    shot("job-10000")
    js("const v = document.querySelector('.tree-viewport'); v.scrollTop = v.scrollHeight")
    wait(css('.tree-row[data-node-id="root.9998"]'), 5, "the last node after scrolling to the end")
    shot("job-10000-end")

    step("the list shows every job with its state; the counts and the state filter")
    api("POST", "/v1/jobs", {"name": "will-fail", "graph": fetch("/status/503")})
    driver.get(BASE + "/ui")
    wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#jobs-table tr[data-job-id]")) >= 5, 5, "five jobs listed")
    wait(css('tr[data-state="failed"]'), 8, "the failed job")
    shot("jobs")
    driver.find_element(By.CSS_SELECTOR, '.count[data-state="cancelled"]').click()
    wait(lambda d: {r.get_attribute("data-state") for r in d.find_elements(By.CSS_SELECTOR, "#jobs-table tr[data-job-id]")} == {"cancelled"},
         5, "only cancelled jobs after the filter")
    api("POST", f"/v1/jobs/{big['id']}/cancel")

    # ------------------------------------------------------------------ console
    step("no console errors")
    collect_console()
    # The browser logs every non-2xx answer of fetch() as a network error: the ones the page asks for on purpose
    # (the retry probe's 404 or 405, the 422 of the invalid job) are expected; anything else is a failure.
    expected = ("status of 404", "status of 405", "status of 422")
    errors = [e for e in console if e["level"] == "SEVERE" and not (e.get("source") == "network" and any(x in e["message"] for x in expected))]
    check(not errors, "console errors: " + json.dumps(errors)[:2000])
    print(f"[ui.test] browser log: {len(console)} entries, none an error", flush=True)

    # ------------------------------------------------------------------ token
    step("with --token: nothing is shown before the token is given")
    status, secret = api("POST", "/v1/jobs", {"name": "secret-job-name", "graph": fetch("/json")}, base=TOKEN_BASE, token=TOKEN)
    check(status == 201, f"submit with token answered {status}")
    driver.get(TOKEN_BASE + "/ui")
    wait(css("#token-form"), 5, "the token form")
    time.sleep(0.3)  # what the page would draw in that time, it would draw now: nothing may appear
    body = driver.find_element(By.TAG_NAME, "body").text
    check("secret-job-name" not in body and not driver.find_elements(By.CSS_SELECTOR, "#jobs-table"), "data shown without the token")
    check(not driver.find_element(By.CSS_SELECTOR, "#nav").is_displayed(), "the navigation is shown without the token")
    shot("token")
    field = driver.find_element(By.CSS_SELECTOR, "#token-input")
    field.send_keys("wrong-token")
    driver.find_element(By.CSS_SELECTOR, "#token-form button").click()
    wait(lambda d: "refused" in d.find_element(By.CSS_SELECTOR, "#token-form").text, 5, "the refusal")
    check(not driver.find_elements(By.CSS_SELECTOR, "#jobs-table"), "data shown with a wrong token")
    field = driver.find_element(By.CSS_SELECTOR, "#token-input")
    field.clear()
    field.send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#token-form button").click()
    wait(css(f'tr[data-job-id="{secret["id"]}"]'), 5, "the job list once the token is given")
    collect_console()
    expected_token = expected + ("status of 401",)
    errors = [e for e in console if e["level"] == "SEVERE" and not (e.get("source") == "network" and any(x in e["message"] for x in expected_token))]
    check(not errors, "console errors: " + json.dumps(errors)[:2000])
    print("[ui.test] PASS", flush=True)
finally:
    driver.quit()
