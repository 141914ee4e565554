"""Dashboard tests: pure logic, pages from the real app, and the browser tier (Chromium)."""
