"""Work a page asks for that takes longer than a request should: tokenizing an upload, packing a trained model
for download, planning a large sweep. It runs in the web worker (`celery_app`), a process beside the web
server; the page shows the work's status from the database and refreshes until it is done."""
