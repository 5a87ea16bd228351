package guard

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// FuzzChangeFromImages: stream images are input; a record of any shape
// decodes to a Change (perhaps one that needs no check), never a panic.
func FuzzChangeFromImages(f *testing.F) {
	f.Add([]byte(`{"id":{"S":"aaaaaaaaaaaaaaaaaaaaaaaaaa"},"kind":{"S":"email"},"state":{"S":"Enqueued"},"attempt":{"N":"0"}}`))
	f.Add([]byte(`{"id":{"N":"1"},"state":{"BOOL":true},"attempt":{"S":"zero"},"runAt":{"N":"1e400"}}`))
	f.Add([]byte(`{"state":{"L":[{"M":{}}]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var img map[string]events.DynamoDBAttributeValue
		if json.Unmarshal(raw, &img) != nil {
			return
		}
		c := ChangeFromImages(img, img)
		if c.needsCheck() && (c.ID == "" || c.Attempt != 0) {
			t.Fatalf("check for %+v", c)
		}
	})
}
