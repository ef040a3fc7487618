"""raykafka's actors and client facade. The public names are re-exported lazily so that
``from actors.errors import ...`` stays cheap."""
