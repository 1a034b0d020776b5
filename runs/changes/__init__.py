"""The change stream: committed changes out to the channel layer, and back in to whoever in
this process follows them. Each module can be read alone:

* ``publishing``: the domain's ``changes`` port: what is published, encoded once;
* ``stream``: the process's one connection to the channel layer: it publishes in commit
  order and keeps one subscription, which forwards each change to its followers;
* ``outbox``: what one socket has yet to be sent, bounded, and written by a task of its own;
* ``waiting``: a REST call's watch of one run's next committed change.
"""
