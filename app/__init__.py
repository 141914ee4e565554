"""The PipeBD job service: REST API, persistence, authentication and the dashboard seam."""
