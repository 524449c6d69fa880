"""The HTTP path: `ANY /http/{upstream}/{path...}` to model APIs and JSON APIs.

routes      the route and the per-upstream client sessions
pipeline    classify → budget → admit → claim (side effects) → forward → record → reply
context     one proxied request as the pipeline sees it (`HttpCall`)
attempts    admission per attempt, sending, relaying the answer
paths, headers      pure: which URL a path names, which headers cross
upstream, downstream  the two sides of the exchange
outcomes    stored and replayed answers;  usage  token usage read from answers
jobs        `Prefer: respond-async` and `GET/DELETE /jobs/{id}`;  deferred_run  running a job
"""
