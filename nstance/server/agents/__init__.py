"""The link to each running agent: health streams, file deliveries and key requests.

``hub`` keeps one session per connected agent, batches health reports into SQLite and asks the
reconciler to look at a group when an agent goes silent or reports unhealthy; ``files`` renders and
signs what an agent is sent (config, certificates); ``batchread`` reads many agents' rows at once.
"""
