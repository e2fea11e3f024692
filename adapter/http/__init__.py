"""The adapter's HTTP surface: the aiohttp application and the metric request handlers."""
