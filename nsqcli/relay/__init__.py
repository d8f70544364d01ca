"""What moves messages somewhere else: to-nsq's copier and to-http's delivery (over the
project's one HTTP client, client/http.py). No click or rich here."""
