"""Headless Chromium driven over its DevTools protocol (websocket-client): open a page, click an element
with the mouse, take a screenshot, and list every request the page made."""
from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page; `requests` holds the URL of every request the page sent."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 1600) -> None:
        import websocket

        assert CHROMIUM is not None, "chromium is not installed: apt-get install chromium (.ci/run does it as root)"
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline, url = time.time() + 60, None
        while url is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            url = found.group(1) if found else None
            if not line and self.proc.poll() is not None:
                break
        assert url, "Chromium did not open its DevTools port"
        self.ws = websocket.create_connection(url, timeout=60)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Network.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command, wait for its answer (keeping the events that arrive meanwhile)."""
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                assert "error" not in reply, reply["error"]
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        """Until the page sends `event` (or has sent it already)."""
        deadline = time.time() + timeout
        while not any(e.get("method") == event for e in self.events):
            assert time.time() < deadline, f"no {event} within {timeout} s"
            self.events.append(json.loads(self.ws.recv()))

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return out["result"].get("value")

    def until(self, expression: str, expected: Any, timeout: float = 10) -> Any:
        """Evaluate until it gives `expected` (an event the page handles later, e.g. a hash change)."""
        deadline = time.time() + timeout
        while (value := self.js(expression)) != expected and time.time() < deadline:
            time.sleep(0.1)
        return value

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the middle of the first element matching `selector`."""
        box = self.js(f"(function () {{ var el = document.querySelector({json.dumps(selector)}); "
                      "el.scrollIntoView({block: 'center'}); var r = el.getBoundingClientRect(); "
                      "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        assert box, f"nothing matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def screenshot(self, path: Path) -> None:
        self.js("window.scrollTo(0, 0)")
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    @property
    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)
