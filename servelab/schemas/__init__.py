"""One typed model per document servelab writes or reads, and the vocabularies they use: the bottom of the house.

Every layer builds these models and every reader validates them; nothing here imports the rest of servelab, so a
result type is reached without importing the code that produces it (`servelab schema NAME` imports one module).
"""
