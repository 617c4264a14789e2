"""Shared by tools/list_flood.py and tools/delete_stall.py: JSON requests to
a streamsink server, and a session directory filled with snapshot copies.
Standard library only."""
import json
import shutil
import urllib.request


def call(url, method="GET", body=None):
    """The parsed JSON answer of one request (None for an empty body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def fill(url, model, directory, files, prefix):
    """Makes one session, saves it and copies its snapshot `files` times into
    directory as PREFIX<i>.snap (the copies name that session inside, so a
    listing reads each and leaves it out). Returns the session's id."""
    sid = call(url + "/v1/sessions", "POST")["id"]
    call(url + "/v1/completions", "POST",
         {"model": model, "prompt": "Hello", "max_tokens": 4, "session_id": sid})
    call(url + f"/v1/sessions/{sid}/save", "POST")
    for i in range(files):
        shutil.copyfile(f"{directory}/{sid}.snap", f"{directory}/{prefix}{i}.snap")
    return sid
