"""The REST API under /api/v1/: personal access tokens, the endpoints (`webapp.api.api`), the audit log.

It stands above every other web app: it calls their services and selectors, as the pages do, and none
imports it.
"""
