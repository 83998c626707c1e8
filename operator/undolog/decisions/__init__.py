"""Pure decisions: plain typed functions over data, tested without any server.

phases: the saga state machine. lifo: which entry is compensated next. retry: how a call's
outcome is classified and when it is tried again. The controller feeds them and applies
what they decide.
"""
