"""Helpers the tests share: the tiny model builder and fixture servers."""
