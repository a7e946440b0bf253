"""The AWS adapters: DynamoDB job store, EventBridge bus, SNS alarm sink. Picked by `timelake.adapters`."""
